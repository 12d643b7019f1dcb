package io.keyedstate.checkpoint

import java.nio.charset.StandardCharsets.UTF_8

import org.apache.hadoop.fs.{FileSystem, Path}
import org.json4s.{JObject, JString}
import org.json4s.jackson.JsonMethods.parse

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * What keyedstate reads of a query checkpoint's offset log (`offsets/<batch>`: a version line,
 * the batch's metadata as JSON, then the sources' offsets): the session settings Spark pinned
 * for the batch, which a restarted query runs with (its state store provider among them).
 */
object OffsetLog {
  /** The names in a checkpoint folder, without hidden and metadata files (`.x.crc`, `_metadata`). */
  def listNames(fs: FileSystem, dir: Path): Seq[String] =
    if (!fs.exists(dir)) Nil
    else fs.listStatus(dir).toSeq.map(_.getPath.getName).filterNot(n => n.startsWith(".") || n.startsWith("_"))

  /** The batch ids with an entry in one of Spark's logs of the checkpoint (`offsets`, `commits`). */
  def batches(fs: FileSystem, root: Path, log: String = "offsets"): Seq[Long] =
    listNames(fs, new Path(root, log)).flatMap(_.toLongOption).sorted

  /** The settings Spark pinned in the offset log entry of `batch`. */
  def pinnedConf(fs: FileSystem, root: Path, batch: Long): Map[String, String] = {
    val path = new Path(root, s"offsets/$batch")
    val in = fs.open(path)
    val lines = try new String(in.readAllBytes(), UTF_8).split("\n", -1).toSeq finally in.close()
    if (lines.size < 2) throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid, s"Offset log entry $path is truncated")
    parse(lines(1)) \ "conf" match {
      case JObject(fields) => fields.collect { case (k, JString(v)) => k -> v }.toMap
      case _ => Map.empty
    }
  }

  /** The settings of the last batch the query planned, or None before its first. */
  def lastPinnedConf(fs: FileSystem, root: Path): Option[Map[String, String]] =
    batches(fs, root).lastOption.map(pinnedConf(fs, root, _))
}
