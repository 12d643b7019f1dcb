package io.keyedstate.checkpoint.restore

import java.io.File
import java.nio.file.Files

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.restore.RestoreOperation
import io.keyedstate.errors.CheckpointFileException
import io.keyedstate.checkpoint.CheckpointLayerFixture
import io.keyedstate.checkpoint.CheckpointStore
import io.keyedstate.checkpoint.LocalFileCache
import io.keyedstate.checkpoint.VersionManifest

/**
 * Restore on its own: a version rebuilt from its snapshot and changelogs into a real RocksDB,
 * from a later snapshot of its own history when one finished, from the local cache when the
 * executor still has the files; a damaged or missing file fails it, naming the path and version.
 */
class RestoreOperationSuite extends AnyFunSuite with CheckpointLayerFixture {

  test("every version restores exactly from its snapshot and changelogs (puts, overwrites, deletes)") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 3)
    try w.commitSome(8) finally w.close()
    (1L to 8L).foreach { v =>
      val (state, stats, manifest) = restore(store, conf, v)
      assert(state == w.state(v), s"version $v")
      assert(stats.changelogRecordsReplayed == manifest.changelogs.map(_.records).sum, s"version $v: $stats")
      assert(stats.filesDownloaded == manifest.allFiles.size && stats.filesReusedLocally == 0, s"version $v: $stats")
      assert(stats.bytesDownloaded == manifest.totalBytes, s"version $v: $stats")
    }
    // The chains stay short: a snapshot every 3 versions.
    assert((1L to 8L).map(v => store.readManifest(v, None)).forall(_.changelogs.size <= 4))
  }

  test("snapshot checkpointing: every version restores from its snapshot alone") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = false)
    val w = new LayerWriter(store, conf)
    try w.commitSome(4) finally w.close()
    (1L to 4L).foreach { v =>
      val (state, stats, manifest) = restore(store, conf, v)
      assert(state == w.state(v) && manifest.snapshotVersion == v && stats.changelogRecordsReplayed == 0)
    }
  }

  test("a snapshot that finished after the last commit is the base of the next restore") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 3)
    try {
      w.commitSome(2)
      // Version 3 starts a background snapshot; no later commit promotes it.
      w.commit(Map("x" -> "3"))
      w.lineage.awaitPendingSnapshot()
    } finally w.close()
    val written = store.readManifest(3, None)
    assert(written.snapshotVersion == 0 && written.changelogs.map(_.version) == Seq(1L, 2L, 3L))
    assert(store.listSnapshotDescriptors().map(_.version) == Seq(3L))
    val (state, stats, used) = restore(store, conf, 3)
    assert(used.snapshotVersion == 3 && used.changelogs.isEmpty, used)
    assert(state == w.state(3) && stats.changelogRecordsReplayed == 0)
    // Versions before it are not rebased on it.
    assert(restore(store, conf, 2)._3.snapshotVersion == 0)

    // An unreadable descriptor is passed over, never trusted: the manifest's own chain is used.
    val descriptor = store.listSnapshotDescriptors().head
    truncate(new File(descriptor.path.toUri.getPath), 10)
    val (again, _, fallback) = restore(store, conf, 3)
    assert(fallback.snapshotVersion == 0 && again == w.state(3))
  }

  test("a restore on an executor that has the files links them from the local cache; a damaged cached copy is downloaded again") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 2)
    try w.commitSome(5) finally w.close()
    val cache = LocalFileCache.forStore(new File(tempDir(), "cache"), store.root.toString)
    val (first, cold, manifest) = restore(store, conf, 5, Some(cache))
    assert(cold.filesReusedLocally == 0 && cold.filesDownloaded == manifest.allFiles.size)
    val (second, warm, _) = restore(store, conf, 5, Some(cache))
    assert(first == w.state(5) && second == w.state(5))
    assert(warm.filesDownloaded == 0 && warm.bytesDownloaded == 0 && warm.filesReusedLocally == manifest.allFiles.size, warm)

    // A cached file of the wrong size is not used.
    val sst = manifest.files.find(f => VersionManifest.isShared(f.localName)).get
    val cached = new File(cache.dir, sst.path.replace('/', '_'))
    truncate(cached, 5)
    val (third, repaired, _) = restore(store, conf, 5, Some(cache))
    assert(third == w.state(5) && repaired.filesDownloaded == 1, repaired)
    assert(cached.length() == sst.size, "the download replaces the damaged cached copy")
  }

  /** A version whose manifest lists a snapshot file and changelogs, on a new executor. */
  private def damagedLoad(damage: (CheckpointStore, VersionManifest) => File): (CheckpointFileException, File) = {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 2)
    try w.commitSome(3) finally w.close()
    val manifest = store.readManifest(3, None)
    assert(manifest.files.nonEmpty && manifest.changelogs.nonEmpty, manifest)
    val damaged = damage(store, manifest)
    val e = intercept[CheckpointFileException](restore(store, conf, 3))
    assert(e.getMessage.contains(damaged.getName) && e.getMessage.contains("version 3"), e.getMessage)
    (e, damaged)
  }

  test("a missing snapshot file fails the restore, naming the path and the version") {
    val (e, _) = damagedLoad { (store, m) =>
      val f = fileOf(store, m.sharedFiles.head); assert(f.delete()); f
    }
    assert(e.getMessage.contains("missing"), e.getMessage)
  }

  test("an altered snapshot file fails its CRC32C, naming the path and the version") {
    val (e, _) = damagedLoad { (store, m) =>
      val f = fileOf(store, m.sharedFiles.head); flipByte(f, 30); f
    }
    assert(e.getMessage.contains("CRC32C"), e.getMessage)
  }

  test("a truncated changelog fails the restore, naming the path and the version") {
    val (e, _) = damagedLoad { (store, m) =>
      val f = fileOf(store, m.changelogs.last.file); truncate(f, f.length() - 3); f
    }
    assert(e.getMessage.contains("damaged"), e.getMessage)
  }

  test("a changelog damaged behind a matching size and checksum is still caught on replay") {
    // With checksums off, the replay's own checks are the last line: a bad log never half-applies.
    val store = storeAt(tempDir())
    val w = new LayerWriter(store, layerConf(changelog = true), snapshotInterval = 100)
    try w.commitSome(2) finally w.close()
    val log = fileOf(store, store.readManifest(2, None).changelogs.last.file)
    Files.write(log.toPath, Array.fill(log.length().toInt)(0x7f.toByte))
    val e = intercept[CheckpointFileException](restore(store, layerConf(changelog = true, verifyChecksums = false), 2))
    assert(e.getMessage.contains(log.getName) && e.getMessage.contains("version 2") && e.getMessage.contains("damaged"),
      e.getMessage)
  }

  test("a failed restore leaves nothing in the cache that a later restore would trust") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 2)
    try w.commitSome(3) finally w.close()
    val manifest = store.readManifest(3, None)
    val sst = fileOf(store, manifest.sharedFiles.head)
    val good = Files.readAllBytes(sst.toPath)
    flipByte(sst, 30)
    val cache = LocalFileCache.forStore(new File(tempDir(), "cache"), store.root.toString)
    intercept[CheckpointFileException](restore(store, conf, 3, Some(cache)))
    Files.write(sst.toPath, good)
    val (state, _, _) = restore(store, conf, 3, Some(cache))
    assert(state == w.state(3))
    assert(Option(cache.dir.listFiles()).getOrElse(Array.empty).forall(!_.getName.endsWith(".part")),
      "no staged download is left behind")
  }

  test("fetchInto names each file as asked and reports what came from the cache") {
    val store = storeAt(tempDir())
    val conf = layerConf(changelog = true)
    val w = new LayerWriter(store, conf, snapshotInterval = 100)
    try w.commitSome(2) finally w.close()
    val logs = store.readManifest(2, None).changelogs.map(_.file)
    val cache = LocalFileCache.forStore(new File(tempDir(), "cache"), store.root.toString)
    val ops = new RestoreOperation(store, cache, conf)
    val target = new File(tempDir(), "logs")
    val fetched = ops.fetchInto(logs, 2, target)(_.path.replace('/', '_'))
    assert(fetched.map(_._1.getName) == logs.map(_.path.replace('/', '_')))
    assert(fetched.map(_._2) == logs.map(f => Some(f.size)))
    assert(ops.fetchInto(logs, 2, new File(tempDir(), "again"))().map(_._2) == logs.map(_ => None))
  }
}
