package io.keyedstate.offline.savepoint

import java.nio.charset.StandardCharsets.UTF_8

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.offline.{QueryCheckpoint, SavepointMetadata}

/**
 * The folder a savepoint is written into: new, or empty, or what a savepoint that died before
 * its metadata left there (a pending marker says so; dropped). While it is written it carries
 * the marker; `_savepoint.json` is published last, by a rename, so that a savepoint exists
 * exactly when its metadata does, and a failure drops the folder so that nothing looks complete.
 */
final class SavepointTarget(val folder: QueryCheckpoint, progress: String => Unit) {
  import SavepointTarget._

  private def pendingMarker: Path = new Path(folder.root, Savepoints.PendingMarker)

  /** A savepoint is never written into its source, nor a source into it. */
  def refuseOverlap(src: QueryCheckpoint): Unit =
    if (within(folder.root, src.root) || within(src.root, folder.root)) {
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"savepoint: the target ${folder.root} " +
        s"and the source ${src.root} overlap; a savepoint goes into a folder of its own")
    }

  /** Refuses a target holding a savepoint or anything else; drops an unfinished savepoint's leftovers. */
  def prepare(): Unit = if (folder.exists) {
    if (folder.fs.exists(SavepointMetadata.path(folder.root))) {
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"savepoint: ${folder.root} already " +
        "holds a savepoint; dispose of it or choose another target")
    }
    if (folder.fs.listStatus(folder.root).nonEmpty) {
      if (!folder.fs.exists(pendingMarker)) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
          s"savepoint: ${folder.root} is not empty and holds no savepoint; choose a new target")
      }
      progress(s"dropping the unfinished savepoint at ${folder.root} (no ${SavepointMetadata.FileName})")
      folder.fs.delete(folder.root, true)
    }
  }

  /** Writes the savepoint `body` builds (its files, then its metadata, returned), from `source`. */
  def writing(source: Path)(body: => SavepointMetadata): SavepointMetadata = {
    val started = System.currentTimeMillis()
    try {
      // Only a folder with the marker is dropped when a savepoint is taken again into it.
      folder.writeFile(pendingMarker, s"$source\n")
      val metadata = body
      publish(metadata)
      folder.fs.delete(pendingMarker, false)
      progress(s"savepoint written: ${metadata.files.size} files, ${metadata.totalBytes} bytes in " +
        s"${(System.currentTimeMillis() - started) / 1000.0} s")
      metadata
    } catch {
      case NonFatal(e) =>
        // Without its metadata the folder is no savepoint; drop it so that nothing looks complete.
        folder.fs.delete(folder.root, true)
        throw e
    }
  }

  private def publish(metadata: SavepointMetadata): Unit = {
    val tmp = new Path(folder.root, s".${SavepointMetadata.FileName}.tmp")
    val out = folder.fs.create(tmp, true)
    try out.write(SavepointMetadata.toJson(metadata).getBytes(UTF_8)) finally out.close()
    if (!folder.fs.rename(tmp, SavepointMetadata.path(folder.root))) {
      throw KeyedStateErrors.checkpointWrite(s"Cannot publish ${SavepointMetadata.path(folder.root)}: the rename " +
        s"of $tmp failed")
    }
  }
}

object SavepointTarget {
  private def within(a: Path, b: Path): Boolean = a == b || a.toString.startsWith(b.toString.stripSuffix("/") + "/")
}
