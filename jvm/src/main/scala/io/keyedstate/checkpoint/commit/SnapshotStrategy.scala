package io.keyedstate.checkpoint.commit

import java.io.File

import io.keyedstate.checkpoint.{CheckpointStore, LocalFiles, ManifestFile, Transfers, VersionManifest}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB

/** Where one commit spent its time and what it moved. */
final case class CommitStats(
    flushMs: Long = 0,
    checkpointMs: Long = 0,
    uploadMs: Long = 0,
    manifestMs: Long = 0,
    bytesUploaded: Long = 0,
    filesUploaded: Int = 0,
    filesReused: Int = 0,
    changelogRecords: Long = 0,
    snapshotBytesUploaded: Long = 0,
    // This commit took a snapshot (uploaded at once, or in the background with changelogs).
    snapshotTaken: Boolean = false,
    // This commit started flushing the memtables in the background, for the next one's snapshot.
    backgroundFlush: Boolean = false,
    // ... because Spark forced it (its coordinator saw the store's snapshot uploads lagging).
    forcedSnapshot: Boolean = false) {
  def totalMs: Long = flushMs + checkpointMs + uploadMs + manifestMs
}

/** A native RocksDB checkpoint on local disk, waiting to be uploaded. */
final case class LocalCheckpoint(dir: File, version: Long, snapshotId: String, flushMs: Long, checkpointMs: Long)

/** A checkpoint whose files are durable: what a manifest lists as its snapshot. */
final case class UploadedSnapshot(
    version: Long,
    files: Seq[ManifestFile],
    local: Seq[(File, ManifestFile)],
    uploadMs: Long,
    bytesUploaded: Long,
    filesUploaded: Int,
    filesReused: Int)

/**
 * Incremental snapshots: flush the memtables, take a native RocksDB checkpoint (hard links), and
 * upload only the SST files that the snapshot it follows does not already hold. Files get names
 * unique to the snapshot, so two attempts at one version never write the same file.
 */
final class SnapshotStrategy(store: CheckpointStore, workDir: File, conf: KeyedStateConf) {

  def checkpointLocally(db: LocalRocksDB, version: Long, snapshotId: String): LocalCheckpoint = {
    val dir = new File(workDir, s"checkpoint-$version-$snapshotId")
    LocalFiles.deleteRecursively(dir)
    val flushMs = LocalFiles.timed(db.flush())
    val checkpointMs = LocalFiles.timed(db.checkpoint(dir))
    LocalCheckpoint(dir, version, snapshotId, flushMs, checkpointMs)
  }

  /**
   * Uploads the checkpoint's files that `reusable` does not hold. SST files are immutable and
   * RocksDB never reuses a file number within one database lineage, so an SST with the same
   * name and size as one in `reusable` (the previous snapshot of this lineage) is the same file.
   */
  def upload(cp: LocalCheckpoint, reusable: Seq[ManifestFile]): UploadedSnapshot = {
    val byName = reusable.filter(f => VersionManifest.isShared(f.localName)).map(f => f.localName -> f).toMap
    val local = Option(cp.dir.listFiles()).getOrElse(Array.empty[File]).toSeq.sortBy(_.getName)
    val (reused, toUpload) = local.partition { f =>
      VersionManifest.isShared(f.getName) && byName.get(f.getName).exists(_.size == f.length())
    }
    var uploaded: Seq[(File, ManifestFile)] = Nil
    val uploadMs = LocalFiles.timed {
      uploaded = Transfers.parallel(toUpload, conf.transferThreads) { f =>
        f -> store.upload(f, f.getName, remoteName(f.getName, cp.version, cp.snapshotId))
      }
    }
    val entries = reused.map(f => f -> byName(f.getName)) ++ uploaded
    UploadedSnapshot(cp.version, entries.map(_._2).sortBy(_.localName), entries, uploadMs,
      bytesUploaded = uploaded.iterator.map(_._2.size).sum,
      filesUploaded = uploaded.size,
      filesReused = reused.size)
  }

  def uploadChangelog(log: File, version: Long, commitId: String): ManifestFile =
    store.upload(log, log.getName, s"${CheckpointStore.ChangelogDir}/$version-$commitId.changelog")

  def discard(cp: LocalCheckpoint): Unit = LocalFiles.deleteRecursively(cp.dir)

  private def remoteName(localName: String, version: Long, snapshotId: String): String =
    if (VersionManifest.isShared(localName)) {
      val dot = localName.lastIndexOf('.')
      s"${CheckpointStore.SharedDir}/${localName.substring(0, dot)}-$snapshotId${localName.substring(dot)}"
    } else s"${CheckpointStore.PrivateDir}/$version-$snapshotId-$localName"
}

object SnapshotStrategy {
  /** Whether a durable path belongs to the snapshot with this id (see `remoteName`). */
  def belongsTo(path: String, snapshotId: String): Boolean = path.contains(snapshotId)
}
