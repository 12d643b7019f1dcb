package io.keyedstate.checkpoint.commit

import scala.concurrent.duration._

import org.scalatest.concurrent.Eventually._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.CheckpointLayerFixture

/**
 * The commit layer on its own: which commits take a snapshot and which start the flush one
 * needs, on a real RocksDB, and that the snapshots so taken restore exactly.
 */
class VersionLineageSuite extends AnyFunSuite with CheckpointLayerFixture {

  // What a commit did: (started a background flush, took a snapshot).
  private val Neither = (false, false)
  private val StartedFlush = (true, false)
  private val TookSnapshot = (false, true)
  private def did(w: LayerWriter): (Boolean, Boolean) = (w.lastStats.backgroundFlush, w.lastStats.snapshotTaken)

  private def puts(version: Long, n: Int): State = (0 until n).map(i => s"v$version-k$i" -> s"value $version/$i").toMap

  /** Runs `commits` on a new writer, then restores every version it committed and compares. */
  private def committing(snapshotInterval: Int, changelog: Boolean = true)(commits: LayerWriter => Unit): Unit = {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = changelog)
    val w = new LayerWriter(store, conf, snapshotInterval)
    try commits(w) finally w.close()
    (1L to w.version).foreach { v => assert(restore(store, conf, v)._1 == w.state(v), s"version $v") }
  }

  test("the commit before a due snapshot starts the flush; the snapshot commit flushes only its own writes") {
    committing(snapshotInterval = 3) { w =>
      val steps = (1 to 7).map { v =>
        w.commit(puts(v, 50))
        if (w.lastStats.backgroundFlush) {
          // RocksDB's own threads write the SSTs: nothing is left in the memtables soon after.
          eventually(timeout(30.seconds), interval(10.millis)) { assert(w.db.unflushedEntries == 0, s"version $v") }
          assert(w.db.totalSstFilesBytes > 0)
        }
        w.lineage.awaitPendingSnapshot()
        did(w)
      }
      // Flushes start at 2 and 5, snapshots (every 3 versions) at 3 and 6.
      assert(steps == Seq(Neither, StartedFlush, TookSnapshot, Neither, StartedFlush, TookSnapshot, Neither), steps)
      w.commit(Map("late" -> "x"))
      assert(w.store.readManifest(8, None).snapshotVersion == 6)
    }
  }

  test("a snapshot that falls due with older writes unflushed (the records rule) is taken one commit later") {
    committing(snapshotInterval = 100) { w =>
      // More changelog records than keys, from the second version on: the records rule.
      w.commit(puts(1, 60000))
      assert(did(w) == Neither, w.lastStats)
      w.commit(puts(1, 60000).map { case (k, _) => k -> "again" })
      assert(did(w) == StartedFlush, w.lastStats)
      w.commit(puts(3, 10))
      assert(did(w) == TookSnapshot, w.lastStats)
      w.lineage.awaitPendingSnapshot()
      w.commit(puts(4, 10))
      assert(w.store.readManifest(4, None).snapshotVersion == 3)
    }
  }

  test("a bulk version with nothing older unflushed is snapshotted at once") {
    committing(snapshotInterval = 100) { w =>
      w.commit(puts(1, 150000))
      assert(did(w) == TookSnapshot, w.lastStats)
    }
  }

  test("a snapshot Spark forces is taken at once, older unflushed writes and all") {
    committing(snapshotInterval = 100) { w =>
      (1 to 3).foreach(v => w.commit(puts(v, 50)))
      assert(w.db.unflushedEntries == 150)
      w.commit(puts(4, 50), forceSnapshot = true)
      assert(did(w) == TookSnapshot && w.db.unflushedEntries == 0, w.lastStats)
      w.lineage.awaitPendingSnapshot()
      w.commit(puts(5, 1))
      assert(w.store.readManifest(5, None).snapshotVersion == 4)
    }
  }

  test("without changelog checkpointing every commit is a snapshot and none starts a background flush") {
    committing(snapshotInterval = 3, changelog = false) { w =>
      (1 to 4).foreach { v =>
        w.commit(puts(v, 20))
        assert(did(w) == TookSnapshot, s"version $v: ${w.lastStats}")
      }
    }
  }
}
