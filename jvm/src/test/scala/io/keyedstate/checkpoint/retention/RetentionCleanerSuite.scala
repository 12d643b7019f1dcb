package io.keyedstate.checkpoint.retention

import java.io.File
import java.nio.file.Files

import org.apache.hadoop.fs.Path
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.TestFileSystems
import io.keyedstate.checkpoint.retention.RetentionCleaner
import io.keyedstate.errors.CheckpointFileException
import io.keyedstate.checkpoint.CheckpointLayerFixture
import io.keyedstate.checkpoint.CheckpointStore
import io.keyedstate.checkpoint.RefusingFileSystem

/**
 * Retention on its own, over checkpoints written by the commit layer: which manifests and files
 * it deletes and which it keeps, the orphan grace period and in-flight uploads, files still
 * needed by a retained version, and a file system that fails or refuses a delete.
 */
class RetentionCleanerSuite extends AnyFunSuite with CheckpointLayerFixture {

  private val Hour = 3600 * 1000L
  private def later: Long = System.currentTimeMillis() + Hour

  /** Every retained version restores on a new executor with exactly what was committed. */
  private def assertRestores(store: CheckpointStore, w: LayerWriter, versions: Seq[Long]): Unit =
    versions.foreach { v =>
      val (state, _, _) = restore(store, w.conf, v)
      assert(state == w.state(v), s"version $v")
    }

  private def referencedBy(store: CheckpointStore): Set[String] = {
    val manifests = store.listManifests().map(r => store.readManifest(r.path, r.version))
    val descriptors = store.listSnapshotDescriptors().map(store.readSnapshotDescriptor)
    (manifests.flatMap(_.allFiles) ++ descriptors.flatMap(_.files)).map(_.path).toSet
  }

  for (changelog <- Seq(false, true)) {
    test(s"keeps the newest versions and what they need, deletes everything else (changelog=$changelog)") {
      val store = storeAt(tempDir())
      val conf = layerConf(changelog = changelog, retain = 3)
      val w = new LayerWriter(store, conf, snapshotInterval = 3)
      try w.commitSome(10) finally w.close()
      val before = store.listDataFiles().map(_._1).toSet
      val stats = new RetentionCleaner(store, conf).cleanup(nowMs = later)

      assert(store.listManifests().map(_.version) == Seq(8L, 9L, 10L))
      assert(stats.manifestsDeleted == 7)
      val present = store.listDataFiles().map(_._1).toSet
      val needed = referencedBy(store)
      assert(present == needed, s"unreferenced: ${present -- needed}, missing: ${needed -- present}")
      assert(stats.filesDeleted == (before -- present).size && stats.filesDeleted > 0, stats)
      // Descriptors older than every retained version's base are gone.
      val oldestBase = (8L to 10L).map(v => store.readManifest(v, None).snapshotVersion).min
      assert(store.listSnapshotDescriptors().forall(_.version >= oldestBase))
      assertRestores(store, w, Seq(8L, 9L, 10L))
      val gone = intercept[CheckpointFileException](store.readManifest(7, None))
      assert(gone.getMessage.contains("7.manifest"))
      // A second cleanup has nothing left to do.
      assert(new RetentionCleaner(store, conf).cleanup(nowMs = later) == CleanupStats(0, 0, 0))
    }
  }

  test("a file of an expired version that a retained version still needs is never deleted, however old") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true, retain = 2)
    // One snapshot at version 1, then changelogs only: version 3 needs version 1's snapshot and
    // version 2's changelog, although versions 1 and 2 expire.
    val w = new LayerWriter(store, conf, snapshotInterval = 100)
    try {
      w.commit(Map("a" -> "1", "b" -> "1"), forceSnapshot = true)
      w.lineage.awaitPendingSnapshot()
      w.commit(Map("c" -> "2"))
      w.commit(Map("d" -> "3"), deletes = Seq("a"))
      w.commit(Map("e" -> "4"))
    } finally w.close()
    val v3 = store.readManifest(3, None)
    assert(v3.snapshotVersion == 1 && v3.changelogs.map(_.version) == Seq(2L, 3L), v3)
    new RetentionCleaner(store, conf).cleanup(nowMs = System.currentTimeMillis() + 24 * Hour)
    assert(store.listManifests().map(_.version) == Seq(3L, 4L))
    val present = store.listDataFiles().map(_._1).toSet
    assert(v3.allFiles.forall(f => present(f.path)), v3.allFiles.map(_.path).filterNot(present))
    assertRestores(store, w, Seq(3L, 4L))
  }

  test("an orphan younger than the grace period, or of an upload in flight, stays; older ones go") {
    val dir = tempDir()
    val store = storeAt(dir)
    val conf = layerConf(retain = 2, graceMs = Hour)
    val w = new LayerWriter(store, conf)
    try w.commitSome(2) finally w.close()
    val orphans = Seq("shared/000099-zombie.sst", "private/9-zombie-OPTIONS", "changelog/9-zombie.changelog",
      ".3.manifest.0a1b.tmp", "shared/000100-inflight.sst")
    orphans.foreach { p =>
      val f = new File(dir, p)
      f.getParentFile.mkdirs()
      Files.write(f.toPath, Array[Byte](1, 2, 3))
    }
    val cleaner = new RetentionCleaner(store, conf)
    val inFlight = (p: String) => p.contains("inflight")
    assert(cleaner.cleanup(inFlight).filesDeleted == 0, "every orphan is younger than the grace period")
    assert(orphans.forall(p => new File(dir, p).exists()))

    val stats = cleaner.cleanup(inFlight, nowMs = System.currentTimeMillis() + 2 * Hour)
    assert(stats.filesDeleted == 4 && stats.bytesDeleted == 12, stats)
    assert(orphans.filter(p => new File(dir, p).exists()) == Seq("shared/000100-inflight.sst"))
    assertRestores(store, w, Seq(1L, 2L))
  }

  test("every attempt of a retained version is kept (checkpoint format v2)") {
    val dir = tempDir()
    val store = storeAt(dir)
    val conf = layerConf(retain = 1, checkpointIds = true)
    val first = new LayerWriter(store, conf)
    try first.commitSome(3) finally first.close()
    // A second attempt at version 3, built on the same version 2 (a retried task): copy the
    // first attempt's manifest under another id.
    val m3 = store.readManifest(3, Some(store.listManifests().filter(_.version == 3).head.checkpointId.get))
    store.writeManifest(m3.copy(checkpointId = "second-attempt"), checkpointIdsEnabled = true)
    new RetentionCleaner(store, conf).cleanup(nowMs = later)
    assert(store.listManifests().map(r => (r.version, r.checkpointId)).toSet ==
      Set((3L, Some(m3.checkpointId)), (3L, Some("second-attempt"))))
    assert(m3.allFiles.forall(f => fileOf(store, f).exists()))
  }

  test("a delete the file system refuses leaves the file for the next cleanup; nothing retained is lost") {
    val dir = tempDir()
    val conf = layerConf(retain = 2)
    val w = new LayerWriter(storeAt(dir), conf)
    try w.commitSome(6) finally w.close()
    val hadoop = TestFileSystems.conf("refusing", classOf[RefusingFileSystem])
    val refusing = new CheckpointStore(new Path(s"refusing://${dir.getAbsolutePath}"), hadoop)
    val before = storeAt(dir).listDataFiles().size
    RefusingFileSystem.refuseDeletes = true
    try new RetentionCleaner(refusing, conf).cleanup(nowMs = later)
    finally RefusingFileSystem.refuseDeletes = false
    assert(storeAt(dir).listManifests().size == 6, "no manifest was deleted")
    assert(storeAt(dir).listDataFiles().size == before)
    assertRestores(storeAt(dir), w, 1L to 6L)

    new RetentionCleaner(refusing, conf).cleanup(nowMs = later)
    assert(storeAt(dir).listManifests().map(_.version) == Seq(5L, 6L))
    assert(storeAt(dir).listDataFiles().map(_._1).toSet == referencedBy(storeAt(dir)))
    assertRestores(storeAt(dir), w, Seq(5L, 6L))
  }

  test("a damaged retained manifest stops the cleanup before any data file is deleted") {
    val dir = tempDir()
    val store = storeAt(dir)
    val conf = layerConf(retain = 2)
    val w = new LayerWriter(store, conf)
    try w.commitSome(5) finally w.close()
    val orphan = new File(dir, "shared/000099-orphan.sst")
    Files.write(orphan.toPath, Array[Byte](1))
    val files = store.listDataFiles().map(_._1).toSet
    truncate(new File(dir, "5.manifest"), 30)
    val e = intercept[CheckpointFileException](new RetentionCleaner(store, conf).cleanup(nowMs = later))
    assert(e.getMessage.contains("5.manifest") && e.getMessage.contains("version 5"), e.getMessage)
    assert(store.listDataFiles().map(_._1).toSet == files, "no file may go while a retained version is unreadable")
    assertRestores(store, w, Seq(4L))
  }
}
