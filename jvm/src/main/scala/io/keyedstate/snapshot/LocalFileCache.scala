package io.keyedstate.snapshot

import java.io.File
import java.nio.file.{Files, StandardCopyOption}

/**
 * Local copies of durable files, named by their path in the checkpoint store, so that a reload
 * on the same executor (after an abort, or of the version just committed) links files instead of
 * downloading them: Flink's local recovery. Holds the files of the last committed or loaded
 * version only.
 */
final class LocalFileCache(val dir: File) {
  dir.mkdirs()

  private def fileFor(entry: ManifestFile): File = new File(dir, entry.path.replace('/', '_'))

  /** The cached copy of `entry`, if present with the expected size. */
  def lookup(entry: ManifestFile): Option[File] =
    Some(fileFor(entry)).filter(f => f.isFile && f.length() == entry.size)

  /** Takes `source` (a checkpoint file already uploaded as `entry`) into the cache. */
  def adopt(source: File, entry: ManifestFile): Unit =
    Files.move(source.toPath, fileFor(entry).toPath, StandardCopyOption.REPLACE_EXISTING)

  /** A file in the cache to download `entry` into. */
  def stagingFile(entry: ManifestFile): File = new File(dir, fileFor(entry).getName + ".part")

  def commitStaged(staged: File, entry: ManifestFile): File = {
    val target = fileFor(entry)
    Files.move(staged.toPath, target.toPath, StandardCopyOption.REPLACE_EXISTING)
    target
  }

  /** Drops every cached file that `entries` do not list. */
  def retainOnly(entries: Seq[ManifestFile]): Unit = {
    val keep = entries.map(fileFor(_).getName).toSet
    Option(dir.listFiles()).getOrElse(Array.empty).filterNot(f => keep(f.getName)).foreach(_.delete())
  }
}
