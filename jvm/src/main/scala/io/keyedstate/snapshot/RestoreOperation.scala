package io.keyedstate.snapshot

import java.io.File
import java.nio.file.{Files, StandardCopyOption}

import io.keyedstate.KeyedStateConf

/** What one load did. */
final case class LoadStats(
    loadMs: Long = 0,
    bytesDownloaded: Long = 0,
    filesDownloaded: Int = 0,
    filesReusedLocally: Int = 0,
    changelogRecordsReplayed: Long = 0)

/**
 * Brings a version's files to local disk: files still in the local cache are used as they are
 * (local recovery), the rest are downloaded in parallel and checked against the manifest's size
 * and CRC32C. Any missing or damaged file fails the load, naming the file and the version;
 * nothing is papered over.
 */
final class RestoreOperation(store: CheckpointStore, cache: LocalFileCache, conf: KeyedStateConf) {

  /** Local copies of `entries` (in order) and the bytes downloaded for each (0 if cached). */
  def fetch(entries: Seq[ManifestFile], version: Long): Seq[(File, Long)] =
    Transfers.parallel(entries, conf.transferThreads) { entry =>
      cache.lookup(entry) match {
        case Some(cached) => cached -> 0L
        case None =>
          val staged = cache.stagingFile(entry)
          try store.download(entry, version, staged, conf.verifyChecksumsOnLoad)
          catch { case e: Throwable => staged.delete(); throw e }
          cache.commitStaged(staged, entry) -> entry.size
      }
    }

  /** Rebuilds `dbDir` from the snapshot files of `manifest`; changelogs are the caller's. */
  def materialize(manifest: VersionManifest, dbDir: File): Seq[(File, Long)] = {
    LocalFiles.deleteRecursively(dbDir)
    dbDir.mkdirs()
    val fetched = fetch(manifest.files, manifest.version)
    manifest.files.zip(fetched).foreach { case (entry, (local, _)) =>
      place(local, new File(dbDir, entry.localName), entry)
    }
    fetched
  }

  /** SST files are immutable, so a hard link is safe; RocksDB's small files are copied. */
  private def place(source: File, target: File, entry: ManifestFile): Unit =
    if (VersionManifest.isShared(entry.localName)) {
      try Files.createLink(target.toPath, source.toPath)
      catch { case _: java.io.IOException | _: UnsupportedOperationException =>
        Files.copy(source.toPath, target.toPath, StandardCopyOption.REPLACE_EXISTING)
      }
    } else Files.copy(source.toPath, target.toPath, StandardCopyOption.REPLACE_EXISTING)
}
