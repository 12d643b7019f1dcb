package io.keyedstate.snapshot

import java.io.File

import io.keyedstate.KeyedStateConf

/** What one load did. */
final case class LoadStats(
    loadMs: Long = 0,
    bytesDownloaded: Long = 0,
    filesDownloaded: Int = 0,
    filesReusedLocally: Int = 0,
    changelogRecordsReplayed: Long = 0)

/**
 * Brings a version's files to local disk: files still in the local cache are linked (local
 * recovery), the rest are downloaded in parallel and checked against the manifest's size and
 * CRC32C. Any missing or damaged file fails the load, naming the file and the version; nothing
 * is papered over.
 */
final class RestoreOperation(store: CheckpointStore, cache: LocalFileCache, conf: KeyedStateConf) {

  /**
   * Places each entry in `targetDir` under its RocksDB name (`name` maps it), returning the
   * local file and the bytes downloaded for it (None when the cache had it).
   */
  def fetchInto(entries: Seq[ManifestFile], version: Long, targetDir: File)(
      name: ManifestFile => String = _.localName): Seq[(File, Option[Long])] = {
    targetDir.mkdirs()
    Transfers.parallel(entries, conf.transferThreads) { entry =>
      val target = new File(targetDir, name(entry))
      if (cache.placeInto(entry, target)) target -> None
      else {
        val staged = cache.stagingFile(entry)
        try store.download(entry, version, staged, conf.verifyChecksumsOnLoad)
        catch { case e: Throwable => staged.delete(); throw e }
        LocalFileCache.place(staged, target, entry)
        cache.adopt(staged, entry)
        target -> Some(entry.size)
      }
    }
  }

  /** Rebuilds `dbDir` from the snapshot files of `manifest`; changelogs are the caller's. */
  def materialize(manifest: VersionManifest, dbDir: File): Seq[(File, Option[Long])] = {
    LocalFiles.deleteRecursively(dbDir)
    fetchInto(manifest.files, manifest.version, dbDir)()
  }
}
