package io.keyedstate.checkpoint

import org.scalatest.funsuite.AnyFunSuite

/**
 * The commit layer on its own: which commits take a snapshot and which start the flush one
 * needs, on a real RocksDB, and that the snapshots so taken restore exactly.
 */
class VersionLineageSuite extends AnyFunSuite with CheckpointLayerFixture {

  private def eventually(what: String)(cond: => Boolean): Unit = {
    val deadline = System.nanoTime() + 30L * 1000 * 1000 * 1000
    while (!cond) {
      if (System.nanoTime() > deadline) fail(s"timed out waiting for $what")
      Thread.sleep(10)
    }
  }

  // What a commit did: (started a background flush, took a snapshot).
  private val Neither = (false, false)
  private val StartedFlush = (true, false)
  private val TookSnapshot = (false, true)
  private def did(w: LayerWriter): (Boolean, Boolean) = (w.lastStats.backgroundFlush, w.lastStats.snapshotTaken)

  private def puts(version: Long, n: Int): State = (0 until n).map(i => s"v$version-k$i" -> s"value $version/$i").toMap

  test("the commit before a due snapshot starts the flush; the snapshot commit flushes only its own writes") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 3)
    try {
      val steps = (1 to 7).map { v =>
        w.commit(puts(v, 50))
        val s = w.lastStats
        if (s.backgroundFlush) {
          // RocksDB's own threads write the SSTs: nothing is left in the memtables soon after.
          eventually(s"the flush started by version $v")(w.db.unflushedEntries == 0)
          assert(w.db.totalSstFilesBytes > 0)
        }
        w.lineage.awaitPendingSnapshot()
        did(w)
      }
      // Flushes start at 2 and 5, snapshots (every 3 versions) at 3 and 6.
      assert(steps == Seq(Neither, StartedFlush, TookSnapshot, Neither, StartedFlush, TookSnapshot, Neither), steps)
      w.commit(Map("late" -> "x"))
      assert(store.readManifest(8, None).snapshotVersion == 6)
    } finally w.close()
    (1L to 8L).foreach { v => assert(restore(store, conf, v)._1 == w.state(v), s"version $v") }
  }

  test("a snapshot that falls due with older writes unflushed (the records rule) is taken one commit later") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 100)
    try {
      // More changelog records than keys, from the second version on: the records rule.
      w.commit(puts(1, 60000))
      assert(did(w) == Neither, w.lastStats)
      w.commit(puts(1, 60000).map { case (k, _) => k -> "again" })
      assert(did(w) == StartedFlush, w.lastStats)
      w.commit(puts(3, 10))
      assert(did(w) == TookSnapshot, w.lastStats)
      w.lineage.awaitPendingSnapshot()
      w.commit(puts(4, 10))
      assert(store.readManifest(4, None).snapshotVersion == 3)
    } finally w.close()
    (1L to 4L).foreach { v => assert(restore(store, conf, v)._1 == w.state(v), s"version $v") }
  }

  test("a bulk version with nothing older unflushed is snapshotted at once") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 100)
    try {
      w.commit(puts(1, 150000))
      assert(did(w) == TookSnapshot, w.lastStats)
    } finally w.close()
    assert(restore(store, conf, 1)._1 == w.state(1))
  }

  test("a snapshot Spark forces is taken at once, older unflushed writes and all") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 100)
    try {
      (1 to 3).foreach(v => w.commit(puts(v, 50)))
      assert(w.db.unflushedEntries == 150)
      w.commit(puts(4, 50), forceSnapshot = true)
      assert(did(w) == TookSnapshot && w.db.unflushedEntries == 0, w.lastStats)
      w.lineage.awaitPendingSnapshot()
      w.commit(puts(5, 1))
      assert(store.readManifest(5, None).snapshotVersion == 4)
    } finally w.close()
    assert(restore(store, conf, 5)._1 == w.state(5))
  }

  test("without changelog checkpointing every commit is a snapshot and none starts a background flush") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = false)
    val w = new LayerWriter(store, conf, snapshotInterval = 3)
    try (1 to 4).foreach { v =>
      w.commit(puts(v, 20))
      assert(did(w) == TookSnapshot, s"version $v: ${w.lastStats}")
    } finally w.close()
  }
}
