package io.keyedstate.snapshot

import java.io.File
import java.nio.file.{Files, StandardCopyOption}

import io.keyedstate.KeyedStateConf

/** What one load did. */
final case class LoadStats(loadMs: Long, bytesDownloaded: Long, filesDownloaded: Int, filesReusedLocally: Int)

/**
 * Rebuilds a version's RocksDB directory from its manifest: files still in the local cache are
 * linked (local recovery), the rest are downloaded in parallel and checked against the
 * manifest's size and CRC32C. Any missing or damaged file fails the load, naming the file and
 * the version; nothing is papered over.
 */
final class RestoreOperation(store: CheckpointStore, cache: LocalFileCache, conf: KeyedStateConf) {

  def restore(manifest: VersionManifest, dbDir: File): LoadStats = {
    val start = System.nanoTime()
    LocalFiles.deleteRecursively(dbDir)
    dbDir.mkdirs()
    val results = Transfers.parallel(manifest.files, conf.transferThreads) { entry =>
      cache.lookup(entry) match {
        case Some(cached) =>
          place(cached, new File(dbDir, entry.localName), entry)
          None
        case None =>
          val staged = cache.stagingFile(entry)
          try store.download(entry, manifest.version, staged, conf.verifyChecksumsOnLoad)
          catch { case e: Throwable => staged.delete(); throw e }
          place(cache.commitStaged(staged, entry), new File(dbDir, entry.localName), entry)
          Some(entry.size)
      }
    }
    cache.retainOnly(manifest.files)
    val downloaded = results.flatten
    LoadStats(
      loadMs = (System.nanoTime() - start) / 1000000,
      bytesDownloaded = downloaded.sum,
      filesDownloaded = downloaded.size,
      filesReusedLocally = manifest.files.size - downloaded.size)
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
