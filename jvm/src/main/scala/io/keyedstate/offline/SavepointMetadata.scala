package io.keyedstate.offline

import scala.util.control.NonFatal

import org.apache.hadoop.fs.{FileSystem, Path}
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

import io.keyedstate.checkpoint.CheckpointStore
import io.keyedstate.errors.KeyedStateErrors

/** A file of a savepoint, relative to its root, with its size and CRC32C. */
final case class SavepointFile(path: String, size: Long, crc32c: Long)

/**
 * A table of a canonical savepoint: one state (or the timers) of a keyed function, or one store
 * of Spark's operator, as Parquet files in `path` (the reader's unflattened rows, see
 * `offline.StateReader`). A store of Spark's operator records its key and value schemas and key
 * encoding (JSON), so that the savepoint is read and restored without Spark's schema files.
 */
final case class SavepointTable(state: String, kind: String, storeName: String, path: String, rows: Long,
    keySchema: Option[String] = None, valueSchema: Option[String] = None, keySpec: Option[String] = None)

/**
 * An operator whose state a savepoint holds: its stores, the function and uid it declared, and
 * in a canonical savepoint its tables and a keyed function's declaration (JSON).
 */
final case class SavepointOperator(
    operatorId: Int,
    name: String,
    stores: Seq[String],
    function: String,
    uid: String,
    declaration: Option[String] = None,
    tables: Seq[SavepointTable] = Nil)

/**
 * `_savepoint.json`, written last: a savepoint exists exactly when it does. `format` is
 * `native` (each partition's committed version as keyedstate's provider stores it: manifest,
 * SST files, changelogs) or `canonical` (each table of each operator as Parquet files, readable
 * by anything that reads Parquet and restorable at any partition count, into any provider that
 * can hold the operator's state). Paths are relative, so the folder can move. The query's logs
 * up to `batchId` travel with it, so a query restored from it resumes at the next batch.
 * `sourceCheckpointIds`: the query ran with checkpoint format v2; the savepoint itself holds its
 * versions by version alone, so a restored query may run with either format.
 */
final case class SavepointMetadata(
    format: String,
    formatVersion: Int,
    keyedstateVersion: String,
    sparkVersion: String,
    createdAtMs: Long,
    source: String,
    batchId: Long,
    stateVersion: Long,
    partitions: Int,
    provider: String,
    sourceCheckpointIds: Boolean,
    operators: Seq[SavepointOperator],
    files: Seq[SavepointFile]) {
  def totalBytes: Long = files.iterator.map(_.size).sum
}

object SavepointMetadata {
  val FileName: String = CheckpointStore.SavepointMetadataFile
  val Native = "native"
  val Canonical = "canonical"
  val Formats: Seq[String] = Seq(Native, Canonical)
  // 2: versions saved by version alone and commits without state checkpoint ids (format v2 queries).
  val FormatVersion = 2

  private implicit val formats: Formats = DefaultFormats

  def path(root: Path): Path = new Path(root, FileName)

  def toJson(m: SavepointMetadata): String = Serialization.writePretty(m)

  /** The metadata of the savepoint at `root`: missing or unreadable, an error naming the file. */
  def read(fs: FileSystem, root: Path): SavepointMetadata = {
    val file = path(root)
    val text = CheckpointStore.readText(fs, file) { e =>
      KeyedStateErrors.fileMissing(s"No savepoint at $root: $file does not exist (not a savepoint, or " +
        "one whose creation did not finish)", e)
    }
    val m =
      try Serialization.read[SavepointMetadata](text)
      catch {
        case NonFatal(e) => throw KeyedStateErrors.fileCorrupt(
          s"Savepoint metadata $file (${text.length} bytes) is corrupt: ${e.getMessage}", e)
      }
    if (!Formats.contains(m.format) || m.formatVersion != FormatVersion) {
      throw KeyedStateErrors.fileCorrupt(s"Savepoint $file has format ${m.format} version ${m.formatVersion}; this " +
        s"build reads ${Formats.mkString(" and ")} version $FormatVersion")
    }
    m
  }
}
