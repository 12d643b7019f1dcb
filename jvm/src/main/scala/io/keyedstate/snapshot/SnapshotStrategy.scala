package io.keyedstate.snapshot

import java.io.File

import io.keyedstate.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB

/** Where one commit spent its time and what it moved. */
final case class CommitStats(
    flushMs: Long,
    checkpointMs: Long,
    uploadMs: Long,
    manifestMs: Long,
    bytesUploaded: Long,
    filesUploaded: Int,
    filesReused: Int) {
  def totalMs: Long = flushMs + checkpointMs + uploadMs + manifestMs
}

/**
 * Incremental snapshots: a commit flushes the memtables, takes a native RocksDB checkpoint (hard
 * links), uploads only the SST files that the version it was built on does not already list,
 * and then writes the manifest atomically. Files are uploaded under names unique to the commit,
 * so two attempts at the same version never write the same file.
 */
final class SnapshotStrategy(
    store: CheckpointStore,
    cache: LocalFileCache,
    workDir: File,
    conf: KeyedStateConf) {

  /**
   * Commits the state in `db` as `version`.
   *
   * @param reusable the shared files of the version `db` was loaded from, by RocksDB file name:
   *                 SST files are immutable and RocksDB never reuses a file number within one
   *                 database lineage, so an equal name and size is the same file.
   */
  def snapshot(
      db: LocalRocksDB,
      version: Long,
      checkpointId: String,
      baseCheckpointId: Option[String],
      columnFamilies: Seq[ManifestColumnFamily],
      reusable: Map[String, ManifestFile]): (VersionManifest, CommitStats) = {
    val checkpointDir = new File(workDir, s"checkpoint-$version-$checkpointId")
    LocalFiles.deleteRecursively(checkpointDir)
    try {
      val flushMs = LocalFiles.timed(db.flush())
      val checkpointMs = LocalFiles.timed(db.checkpoint(checkpointDir))

      val local = Option(checkpointDir.listFiles()).getOrElse(Array.empty[File]).toSeq.sortBy(_.getName)
      val (reused, toUpload) = local.partition { f =>
        VersionManifest.isShared(f.getName) && reusable.get(f.getName).exists(_.size == f.length())
      }
      var uploaded: Seq[(File, ManifestFile)] = Nil
      val uploadMs = LocalFiles.timed {
        uploaded = Transfers.parallel(toUpload, conf.transferThreads) { f =>
          f -> store.upload(f, f.getName, remoteName(f.getName, version, checkpointId))
        }
      }
      val entries = reused.map(f => f -> reusable(f.getName)) ++ uploaded
      val manifest = VersionManifest(
        formatVersion = VersionManifest.FormatVersion,
        version = version,
        checkpointId = checkpointId,
        baseCheckpointId = baseCheckpointId,
        createdAtMs = System.currentTimeMillis(),
        columnFamilies = columnFamilies,
        files = entries.map(_._2).sortBy(_.localName))
      val manifestMs = LocalFiles.timed(store.writeManifest(manifest, conf.checkpointIdsEnabled))

      // Keep the committed files locally, so a reload here needs no download.
      entries.foreach { case (f, entry) => cache.adopt(f, entry) }
      cache.retainOnly(manifest.files)

      val stats = CommitStats(flushMs, checkpointMs, uploadMs, manifestMs,
        bytesUploaded = uploaded.iterator.map(_._2.size).sum,
        filesUploaded = uploaded.size,
        filesReused = reused.size)
      (manifest, stats)
    } finally LocalFiles.deleteRecursively(checkpointDir)
  }

  private def remoteName(localName: String, version: Long, checkpointId: String): String =
    if (VersionManifest.isShared(localName)) {
      val dot = localName.lastIndexOf('.')
      s"${CheckpointStore.SharedDir}/${localName.substring(0, dot)}-$checkpointId${localName.substring(dot)}"
    } else s"${CheckpointStore.PrivateDir}/$version-$checkpointId-$localName"
}
