package io.keyedstate.offline

import java.util.UUID

import scala.collection.mutable.ArrayBuffer

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, UnsafeRow}
import org.apache.spark.sql.catalyst.util.{ArrayBasedMapData, ArrayData, GenericArrayData}
import org.apache.spark.sql.functions.{col, explode}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types._
import org.apache.spark.util.SerializableConfiguration

import io.keyedstate.conf.KeyedStateErrors
import io.keyedstate.errors.ErrorId
import io.keyedstate.process.StateKind

/**
 * `keyedstate.state.read` (docs/state-processor.md): one table of a checkpoint's state (a native
 * savepoint is laid out as one) at any committed batch, as a typed DataFrame. A keyed function's
 * state has its key columns and `value` (a list one row per element and a map one row per entry
 * with `user_map_key`, or with `flatten = false` an array or map column); its timers
 * `timestamp` and the key columns; its operator state `value` per partition. A store of Spark's
 * own operator has `key` and `value` structs, as Spark's `statestore` reader gives them. Every
 * row has its `partition_id`. TTL'd states read as the query sees them at that batch: expired
 * entries hidden. Runs as a Spark job, one task per state partition, through the provider the
 * checkpoint was written with.
 */
object StateReader {
  private val CheckpointFormatVersionKey = "spark.sql.streaming.stateStore.checkpointFormatVersion"

  /** The entry point of the Python package; `batchId` < 0 reads the last committed batch. */
  def read(spark: SparkSession, path: String, operator: String, state: String, batchId: Long,
      flatten: Boolean): DataFrame = {
    val ckpt = QueryCheckpoint.at(path, QueryCheckpoint.hadoopConf(spark))
    val (op, name) = (Option(operator).getOrElse(""), Option(state).getOrElse(""))
    val canonical = if (ckpt.fs.exists(SavepointMetadata.path(ckpt.root))) {
      Some(SavepointMetadata.read(ckpt.fs, ckpt.root)).filter(_.format == SavepointMetadata.Canonical)
    } else None
    canonical match {
      case Some(m) =>
        if (batchId >= 0 && batchId != m.batchId) {
          throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"the savepoint ${ckpt.root} holds " +
            s"batch ${m.batchId} only, not $batchId")
        }
        val table = StateTables(ckpt, m).find(op, name)
        val stored = m.operators.find(_.operatorId == table.operatorId).toSeq.flatMap(_.tables)
          .find(_.state == table.state).getOrElse(throw KeyedStateErrors.fileCorrupt(
            s"${SavepointMetadata.path(ckpt.root)} lists no files for ${table.describe}"))
        readTable(spark, ckpt, stored, table, flatten)
      case None =>
        val batch = committedBatch(ckpt, batchId)
        read(spark, ckpt, batch, StateTables(ckpt, batch).find(op, name), flatten)
    }
  }

  /** A table of a canonical savepoint, from its Parquet files (unflattened), flattened on request. */
  def readTable(spark: SparkSession, sp: QueryCheckpoint, stored: SavepointTable, table: StateTable,
      flatten: Boolean): DataFrame = {
    val df = spark.read.schema(schemaOf(table, flatten = false)).parquet(new Path(sp.root, stored.path).toString)
    val keys = df.columns.toSeq.dropRight(1).map(col)
    if (!flatten || table.kind == StateTable.SparkStore || table.kind == StateTable.Timers) df
    else StateKind.parse(table.kind) match {
      case StateKind.List | StateKind.OperatorList => df.select(keys :+ explode(col("value")).as("value"): _*)
      case StateKind.Map => df.select(keys :+ explode(col("value")).as(Seq("user_map_key", "value")): _*)
      case _ => df
    }
  }

  /** A committed batch of the checkpoint: `requested`, or the last one when negative. */
  def committedBatch(ckpt: QueryCheckpoint, requested: Long): Long = {
    val last = ckpt.lastCommit()
    if (requested < 0) last
    else if (ckpt.fs.exists(ckpt.commitPath(requested))) requested
    else {
      val committed = ckpt.batches("commits")
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"batch $requested of ${ckpt.root} is " +
        s"not committed (no ${ckpt.commitPath(requested)}); its commit log holds batches " +
        s"${committed.headOption.getOrElse(0L)} to $last")
    }
  }

  /** The rows' schema of `table` as a read returns it. */
  def schemaOf(table: StateTable, flatten: Boolean): StructType = {
    val f = table.family
    val fields: Seq[StructField] = table.kind match {
      case StateTable.SparkStore => Seq(StructField("key", f.keySchema), StructField("value", f.valueSchema))
      case StateTable.Timers => f.keySchema.fields.toSeq
      case kind => StateKind.parse(kind) match {
        case StateKind.Value => f.keySchema.fields.toSeq ++ f.valueSchema.fields
        case StateKind.List if flatten => f.keySchema.fields.toSeq ++ f.valueSchema.fields
        case StateKind.List => f.keySchema.fields.toSeq :+ StructField("value", ArrayType(valueType(table)))
        case StateKind.Map if flatten => f.keySchema.fields.toSeq ++ f.valueSchema.fields
        case StateKind.Map =>
          val mapKey = f.keySchema.last.dataType
          f.keySchema.fields.toSeq.dropRight(1) :+ StructField("value", MapType(mapKey, valueType(table)))
        case StateKind.OperatorList =>
          Seq(StructField("value", if (flatten) elementType(table) else valueType(table)))
      }
    }
    StructType(StructField("partition_id", IntegerType, nullable = false) +: fields)
  }

  private def valueType(table: StateTable): DataType = table.family.valueSchema.head.dataType
  private def elementType(table: StateTable): DataType = valueType(table).asInstanceOf[ArrayType].elementType

  def read(spark: SparkSession, ckpt: QueryCheckpoint, batch: Long, table: StateTable, flatten: Boolean): DataFrame = {
    val op = table.operatorId
    val partitions = ckpt.partitions(op)
    // Checkpoint format v2: each partition's store is loaded by the id the commit recorded.
    val ids = if (table.storeName == StateStoreId.DEFAULT_STORE_NAME) {
      ckpt.defaultStoreCheckpointIds(batch, op, partitions)
    } else Map.empty[Int, String]
    // The offset log does not pin the format version; the stores must know they are loaded by id.
    val formatConf = if (ids.isEmpty) Map.empty else Map(CheckpointFormatVersionKey -> "2")
    val conf = KeyedProcessSqlBridge.sqlConfWith(spark, ckpt.pinnedConf(batch) ++ formatConf)
    val storeConf = new StateStoreConf(conf, table.ttlOptions)
    val hadoopConf = new SerializableConfiguration(ckpt.hadoopConf)
    val stateRoot = ckpt.stateRoot.toString
    val version = batch + 1
    val rdd = spark.sparkContext.parallelize(partitions, math.max(1, partitions.size)).mapPartitions { ps =>
      ps.flatMap(p => readPartition(stateRoot, table, p, version, ids.get(p), storeConf, hadoopConf.value, flatten))
    }
    KeyedProcessSqlBridge.internalCreateDataFrame(spark, rdd, schemaOf(table, flatten))
  }

  /** Executor side: the rows of one partition's version of the table. */
  private def readPartition(
      stateRoot: String,
      table: StateTable,
      partition: Int,
      version: Long,
      checkpointId: Option[String],
      storeConf: StateStoreConf,
      hadoopConf: Configuration,
      flatten: Boolean): Seq[InternalRow] = {
    val providerId = StateStoreProviderId(
      StateStoreId(stateRoot, table.operatorId, partition, table.storeName), UUID.randomUUID())
    val provider = StateStoreProvider.createAndInit(providerId, table.storeKeySchema, table.storeValueSchema,
      table.storeSpec, useColumnFamilies = table.columnFamilies, storeConf, hadoopConf,
      useMultipleValuesPerKey = table.columnFamilies, None)
    try {
      val store = provider.getReadStore(version, checkpointId)
      try {
        val f = table.family
        val present =
          if (!table.columnFamilies) true
          else {
            // Registering tells the store how to decode the family (it may not exist yet).
            store.registerColFamily(f.name, f.keySchema, f.valueSchema, f.spec, f.multipleValues, f.name.startsWith("$"))
            store.allColumnFamilyNames.contains(f.name)
          }
        if (!present) Nil
        else {
          val it = if (f.multipleValues) store.iteratorWithMultiValues(f.name) else store.iterator(f.name)
          try new PartitionRows(table, partition, flatten).of(it.map(p => (p.key, p.value))) finally it.close()
        }
      } finally store.release()
    } finally provider.close()
  }
}

/** One partition's stored pairs of a table as the rows a read returns (see [[StateReader]]). */
private final class PartitionRows(table: StateTable, partition: Int, flatten: Boolean) {
  private val f = table.family
  private val keyTypes = f.keySchema.fields.map(_.dataType)

  // Copied: the values may point into the iterator's reused rows.
  private def row(values: Any*): InternalRow = new GenericInternalRow((partition +: values).toArray[Any]).copy()
  private def keyValues(key: UnsafeRow, n: Int): Seq[Any] = (0 until n).map(i => key.get(i, keyTypes(i)))
  private def value(v: UnsafeRow): Any = v.get(0, f.valueSchema.head.dataType)

  def of(pairs: Iterator[(UnsafeRow, UnsafeRow)]): Seq[InternalRow] = table.kind match {
    case StateTable.SparkStore => pairs.map { case (k, v) => row(k.copy(), v.copy()) }.toVector
    case StateTable.Timers => pairs.map { case (k, _) => row(keyValues(k, keyTypes.length): _*) }.toVector
    case kind => StateKind.parse(kind) match {
      case StateKind.OperatorList =>
        pairs.flatMap { case (_, v) =>
          val elements = value(v).asInstanceOf[ArrayData]
          if (flatten) {
            val t = f.valueSchema.head.dataType.asInstanceOf[ArrayType].elementType
            (0 until elements.numElements()).map(i => row(elements.get(i, t)))
          } else Seq(row(elements.copy()))
        }.toVector
      case StateKind.List if !flatten => grouped(pairs, keyTypes.length) { (key, entries) =>
        row(key :+ new GenericArrayData(entries.map(e => value(e._2)).toArray): _*)
      }
      case StateKind.Map if !flatten => grouped(pairs, keyTypes.length - 1) { (key, entries) =>
        val mapKeyType = keyTypes.last
        row(key :+ ArrayBasedMapData(entries.map(_._1.get(keyTypes.length - 1, mapKeyType)).toArray,
          entries.map(e => value(e._2)).toArray): _*)
      }
      case _ => pairs.map { case (k, v) => row(keyValues(k, keyTypes.length) :+ value(v): _*) }.toVector
    }
  }

  /** Consecutive pairs whose first `n` key columns are equal, one row each (a key's list
   *  elements and map entries are stored next to each other). */
  private def grouped(pairs: Iterator[(UnsafeRow, UnsafeRow)], n: Int)(
      out: (Seq[Any], Seq[(UnsafeRow, UnsafeRow)]) => InternalRow): Seq[InternalRow] = {
    val rows = Vector.newBuilder[InternalRow]
    val group = ArrayBuffer.empty[(UnsafeRow, UnsafeRow)]
    var current: Seq[Any] = null
    pairs.foreach { case (k, v) =>
      val stored = k.copy()
      val key = keyValues(stored, n)
      if (current != null && !sameKey(key, current)) { rows += out(current, group.toSeq); group.clear() }
      current = key
      group += ((stored, v.copy()))
    }
    if (current != null) rows += out(current, group.toSeq)
    rows.result()
  }

  private def sameKey(a: Seq[Any], b: Seq[Any]): Boolean = a.corresponds(b) {
    case (x: Array[Byte], y: Array[Byte]) => java.util.Arrays.equals(x, y)
    case (x, y) => x == y
  }
}
