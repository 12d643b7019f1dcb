package io.keyedstate.checkpoint

import java.io.{File, IOException}
import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, NoSuchFileException, StandardCopyOption}
import java.security.MessageDigest
import java.util.concurrent.ConcurrentHashMap

/**
 * Local copies of one store partition's durable files, named by their path in the checkpoint,
 * so that a load on an executor that still has them links files instead of downloading them:
 * Flink's local recovery. The cache belongs to the store's checkpoint location, not to one
 * provider instance, so it also serves the next run of a restarted query on the same executor.
 * It holds the files of the last version committed or loaded there.
 *
 * Provider instances of the same store (an old run not yet unloaded, a new run) may share it:
 * every operation holds the store's lock, and files are only ever handed out as links or copies
 * in the caller's own directory, so a concurrent `retainOnly` can cost a download, never a file.
 */
final class LocalFileCache private (val dir: File, lock: Object) {
  dir.mkdirs()

  private def fileFor(entry: ManifestFile): File = new File(dir, entry.path.replace('/', '_'))

  /**
   * Places the cached copy of `entry` at `target` (hard link for immutable files, copy for
   * RocksDB's small mutable ones); false if it is not cached with the expected size.
   */
  def placeInto(entry: ManifestFile, target: File): Boolean = lock.synchronized {
    val cached = fileFor(entry)
    if (!cached.isFile || cached.length() != entry.size) false
    else
      try { LocalFileCache.place(cached, target, entry); true }
      catch { case _: NoSuchFileException => false }
  }

  /**
   * Takes `source` (a file already made durable as `entry`) into the cache. The cache is only an
   * optimisation: if the file cannot be kept, it is dropped and a later load downloads it.
   */
  def adopt(source: File, entry: ManifestFile): Unit = lock.synchronized {
    try {
      dir.mkdirs()
      Files.move(source.toPath, fileFor(entry).toPath, StandardCopyOption.REPLACE_EXISTING)
    } catch {
      case _: IOException => source.delete()
    }
  }

  /** A file outside the cache's names to download `entry` into, then `adopt`. */
  def stagingFile(entry: ManifestFile): File =
    new File(dir, s".${fileFor(entry).getName}.${java.util.UUID.randomUUID()}.part")

  /** Drops every cached file that `entries` do not list, except those `alsoKeep` names. */
  def retainOnly(entries: Seq[ManifestFile], alsoKeep: String => Boolean = _ => false): Unit =
    lock.synchronized {
      val keep = entries.map(fileFor(_).getName).toSet
      Option(dir.listFiles()).getOrElse(Array.empty)
        .filterNot(f => keep(f.getName) || alsoKeep(f.getName) || f.getName.endsWith(".part"))
        .foreach(_.delete())
    }
}

object LocalFileCache {
  private val locks = new ConcurrentHashMap[String, Object]()

  /** The cache of the store whose checkpoint directory is `storeLocation`, under `base`. */
  def forStore(base: File, storeLocation: String): LocalFileCache = {
    val digest = MessageDigest.getInstance("SHA-256").digest(storeLocation.getBytes(UTF_8))
    val dir = new File(base, digest.take(12).map(b => f"$b%02x").mkString)
    new LocalFileCache(dir, locks.computeIfAbsent(dir.getAbsolutePath, _ => new Object))
  }

  /**
   * SST and blob files are immutable, so a hard link is safe; RocksDB's small files are copied.
   * A vanished source is a `NoSuchFileException`; a failed write names the target.
   */
  private[checkpoint] def place(source: File, target: File, entry: ManifestFile): Unit =
    LocalFiles.writing(s"a local copy of state file ${entry.path} to", target) {
      if (VersionManifest.isShared(entry.localName)) {
        Files.deleteIfExists(target.toPath)
        try Files.createLink(target.toPath, source.toPath)
        catch {
          case e: NoSuchFileException => throw e
          case _: IOException | _: UnsupportedOperationException =>
            Files.copy(source.toPath, target.toPath, StandardCopyOption.REPLACE_EXISTING)
        }
      } else Files.copy(source.toPath, target.toPath, StandardCopyOption.REPLACE_EXISTING)
    }
}
