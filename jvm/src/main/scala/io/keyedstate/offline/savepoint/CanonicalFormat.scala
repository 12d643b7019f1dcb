package io.keyedstate.offline.savepoint

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.json4s.jackson.JsonMethods

import io.keyedstate.errors.KeyedStateErrors
import io.keyedstate.offline.{CheckpointWriter, QueryCheckpoint, SavepointFile, SavepointMetadata, SavepointOperator,
  SavepointTable, StateReader, StateTable, StateTables}

/**
 * The canonical format: each table of each operator (a keyed function's states, timers and
 * operator state; each store of Spark's operators) as Parquet files under
 * `tables/<operator>/<n>-<state>/`, in the reader's unflattened form (`keyedstate.state.read`
 * with `flatten=False`): key columns and values typed as the query declared them, readable by
 * anything that reads Parquet. Independent of the backend: a restore writes every row through
 * the target provider at any partition count ([[CheckpointWriter]]), so Spark's own operators may
 * move to Spark's RocksDB provider and back. TTL'd values keep their last-access times.
 *
 * State of keyedstate's provider is pinned first: `native` links (or copies) the batch's version
 * into the savepoint's folder, the tables are read from there, and the pinned files go. However
 * long the read takes, the running query's retention cannot delete what it reads.
 */
final class CanonicalFormat(spark: SparkSession, hadoopConf: Configuration, progress: String => Unit,
    native: NativeFormat) extends SavepointFormat {

  def name: String = SavepointMetadata.Canonical

  def check(src: QueryCheckpoint, batch: Long): Unit = ()

  def write(src: QueryCheckpoint, dst: QueryCheckpoint, batch: Long, partitions: Int,
      usesCheckpointIds: Boolean, gaps: BatchGaps): (Seq[SavepointOperator], Seq[SavepointFile]) = {
    // A bootstrap's savepoint holds no logs to read a pinned copy by: its own checkpoint is read.
    val pin = src.pinnedConf(batch).get(QueryCheckpoint.ProviderKey).contains(QueryCheckpoint.OurProvider) &&
      dst.fs.exists(dst.commitPath(batch))
    val pinned = if (pin) {
      progress("pinning the state (a native copy, read and then removed)")
      native.write(src, dst, batch, partitions, usesCheckpointIds, gaps)._2
    } else Nil
    val from = if (pin) dst else src
    val tables = StateTables(from, batch)
    val operators = tables.operators.map { case (op, opTables) =>
      val written = opTables.zipWithIndex.map { case (table, i) =>
        gaps.await()
        progress(s"writing ${table.describe}")
        CanonicalFormat.writeTable(spark, dst, i, table, StateReader.read(spark, from, batch, table, flatten = false))
      }
      val declaration = tables.declarationOf(op).map(d => JsonMethods.compact(d.toJson))
      val first = opTables.headOption
      SavepointOperator(op, src.operatorName(op), opTables.map(_.storeName).distinct,
        first.map(_.function).getOrElse(""), first.map(_.uid).getOrElse(""), declaration, written)
    }
    pinned.foreach(f => dst.fs.delete(new Path(dst.root, f.path), false))
    if (pinned.nonEmpty) Savepoints.deleteEmptyFolders(dst.fs, dst.stateRoot)
    (operators, operators.flatMap(_.tables).flatMap(t => CanonicalFormat.dataFiles(dst, t.path)))
  }


  def restore(sp: QueryCheckpoint, metadata: SavepointMetadata, dst: QueryCheckpoint, partitions: Int,
      provider: Option[String]): Long = {
    val writer = new CheckpointWriter(spark, dst, metadata.batchId, partitions)
    val tableFiles = metadata.files.filter(_.path.startsWith(CanonicalFormat.TablesDir + "/"))
    val logs = metadata.files.filterNot(tableFiles.contains).map(_.path)
    writer.copyMetadata(sp, logs)
    provider.foreach { p =>
      dst.batches("offsets").filter(_ >= metadata.batchId).foreach { b =>
        dst.writeFile(dst.offsetPath(b), dst.withPinnedConf(b, QueryCheckpoint.ProviderKey, p))
      }
    }
    val tables = StateTables(sp, metadata)
    for (o <- metadata.operators; (store, stored) <- o.tables.groupBy(_.storeName).toSeq.sortBy(_._1)) {
      val frames = stored.map { t =>
        val table = tables.find(o.operatorId.toString, t.state)
        table -> StateReader.readSaved(spark, sp, metadata, table, flatten = false)
      }
      progress(s"writing operator ${o.operatorId}${if (store == StateStoreId.DEFAULT_STORE_NAME) "" else s" store '$store'"} " +
        s"at $partitions partitions")
      val written = writer.writeStore(o.operatorId, store, frames, o.declaration, Map.empty, metadata.partitions)
      stored.zip(written).foreach { case (t, n) =>
        if (n != t.rows) {
          throw KeyedStateErrors.fileCorrupt(s"Savepoint table ${new Path(sp.root, t.path)} holds ${t.rows} rows " +
            s"(${SavepointMetadata.path(sp.root)}); $n were restored")
        }
      }
    }
    tableFiles.iterator.map(_.size).sum
  }
}

object CanonicalFormat {
  val TablesDir = "tables"

  /**
   * Writes one table (rows in the reader's unflattened form) as Parquet under
   * `tables/<operator>/<index>-<state>`; a store of Spark's operator records its schemas.
   */
  def writeTable(spark: SparkSession, dst: QueryCheckpoint, index: Int, table: StateTable, rows: DataFrame): SavepointTable = {
    val relative = s"$TablesDir/${table.operatorId}/$index-${safeName(table.state)}"
    val path = new Path(dst.root, relative).toString
    rows.write.parquet(path)
    val count = spark.read.parquet(path).count()
    val schemas = if (table.isKeyedFunction) None else Some(table.family)
    SavepointTable(table.state, table.kind, table.storeName, relative, count, schemas.map(_.keySchema.json),
      schemas.map(_.valueSchema.json), schemas.map(f => JsonMethods.compact(f.spec.jsonValue)))
  }

  /** The Parquet files Spark wrote for one table, with their sizes and CRC32C. */
  def dataFiles(dst: QueryCheckpoint, relative: String): Seq[SavepointFile] =
    dst.fs.listStatus(new Path(dst.root, relative)).toSeq
      .filter(st => st.isFile && !st.getPath.getName.startsWith(".") && !st.getPath.getName.startsWith("_"))
      .map { st =>
        val file = s"$relative/${st.getPath.getName}"
        val (size, crc) = Savepoints.checksum(dst.fs, st.getPath, s"Savepoint file ${st.getPath}")
        SavepointFile(file, size, crc)
      }
      .sortBy(_.path)

  /** A state's name as a folder name: letters, digits, `-` and `_` (the metadata keeps the name). */
  def safeName(state: String): String = state.map(c => if (c.isLetterOrDigit || c == '-' || c == '_') c else '_')
}
