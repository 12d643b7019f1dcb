package io.keyedstate.offline

import java.util.UUID

import scala.collection.mutable.ArrayBuffer

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.TaskContext
import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, UnsafeRow}
import org.apache.spark.sql.catalyst.util.{ArrayBasedMapData, ArrayData, GenericArrayData}
import org.apache.spark.sql.functions.{arrays_zip, col, element_at, explode}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types._
import org.apache.spark.util.SerializableConfiguration

import io.keyedstate.TaskStateStore
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.engine.StateKind
import io.keyedstate.shims.{SparkShims, StoreApi}

/**
 * `keyedstate.state.read` (docs/state-processor.md): one table of a checkpoint's state (a native
 * savepoint is laid out as one) at any committed batch, as a typed DataFrame. A keyed function's
 * state has its key columns and `value` (a list one row per element and a map one row per entry
 * with `user_map_key`, or with `flatten = false` an array or map column); its timers
 * `timestamp` and the key columns; its operator state `value` per partition. A store of Spark's
 * own operator has `key` and `value` structs, as Spark's `statestore` reader gives them. Every
 * row has its `partition_id`. TTL'd states read as the query sees them at that batch: expired
 * entries hidden, and each value (element, entry) with its `last_access_timestamp` (the
 * milliseconds its TTL counts from: a list's as an array, a map's as a map, unflattened). Runs as a Spark job, one task per state partition, through the provider the
 * checkpoint was written with.
 */
object StateReader {
  private val CheckpointFormatVersionKey = "spark.sql.streaming.stateStore.checkpointFormatVersion"
  /** The column of a TTL'd state's last-access times (Flink's `TtlValue.lastAccessTimestamp`). */
  val LastAccess = "last_access_timestamp"

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
        readSaved(spark, ckpt, m, StateTables(ckpt, m).find(op, name), flatten)
      case None =>
        val batch = committedBatch(ckpt, batchId)
        read(spark, ckpt, batch, StateTables(ckpt, batch).find(op, name), flatten)
    }
  }

  /** A table of a savepoint `m` (at `sp`), native or canonical. */
  def readSaved(spark: SparkSession, sp: QueryCheckpoint, m: SavepointMetadata, table: StateTable,
      flatten: Boolean): DataFrame =
    if (m.format != SavepointMetadata.Canonical) read(spark, sp, m.batchId, table, flatten)
    else {
      val stored = m.operators.find(_.operatorId == table.operatorId).toSeq.flatMap(_.tables)
        .find(_.state == table.state).getOrElse(throw KeyedStateErrors.fileCorrupt(
          s"${SavepointMetadata.path(sp.root)} lists no files for ${table.describe}"))
      readTable(spark, sp, stored, table, flatten)
    }

  /** A table of a canonical savepoint, from its Parquet files (unflattened), flattened on request. */
  private def readTable(spark: SparkSession, sp: QueryCheckpoint, stored: SavepointTable, table: StateTable,
      flatten: Boolean): DataFrame = {
    val df = spark.read.schema(schemaOf(table, flatten = false)).parquet(new Path(sp.root, stored.path).toString)
    val keys = df.columns.toSeq.filterNot(Set("value", LastAccess)).map(col)
    if (!flatten || table.kind == StateTable.SparkStore || table.kind == StateTable.Timers) df
    else (StateKind.parse(table.kind), table.lastAccess) match {
      case (StateKind.List, true) =>
        val zipped = explode(arrays_zip(col("value"), col(LastAccess))).as("e")
        df.select(keys :+ zipped: _*).select(keys :+ col("e.value").as("value") :+ col(s"e.$LastAccess").as(LastAccess): _*)
      case (StateKind.List | StateKind.OperatorList | StateKind.OperatorUnionList, _) => df.select(keys :+ explode(col("value")).as("value"): _*)
      case (StateKind.Map, stamped) =>
        val entries = df.select(keys ++ Seq(explode(col("value")).as(Seq("user_map_key", "value"))) ++
          (if (stamped) Seq(col(LastAccess).as("stamps")) else Nil): _*)
        if (!stamped) entries
        else entries.select(keys ++ Seq(col("user_map_key"), col("value"),
          element_at(col("stamps"), col("user_map_key")).as(LastAccess)): _*)
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
    def stamps(t: DataType) = if (table.lastAccess) Seq(StructField(LastAccess, t)) else Nil
    val fields: Seq[StructField] = table.kind match {
      case StateTable.SparkStore => Seq(StructField("key", f.keySchema), StructField("value", f.valueSchema))
      case StateTable.Timers => f.keySchema.fields.toSeq
      case kind => StateKind.parse(kind) match {
        case StateKind.Value | StateKind.Broadcast => f.keySchema.fields.toSeq ++ f.valueSchema.fields ++ stamps(LongType)
        case StateKind.List if flatten => f.keySchema.fields.toSeq ++ f.valueSchema.fields ++ stamps(LongType)
        case StateKind.List =>
          f.keySchema.fields.toSeq ++ Seq(StructField("value", ArrayType(valueType(table)))) ++
            stamps(ArrayType(LongType, containsNull = false))
        case StateKind.Map if flatten => f.keySchema.fields.toSeq ++ f.valueSchema.fields ++ stamps(LongType)
        case StateKind.Map =>
          val mapKey = f.keySchema.last.dataType
          f.keySchema.fields.toSeq.dropRight(1) ++ Seq(StructField("value", MapType(mapKey, valueType(table)))) ++
            stamps(MapType(mapKey, LongType, valueContainsNull = false))
        case StateKind.OperatorList | StateKind.OperatorUnionList =>
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

  /**
   * Executor side: the rows of one partition's version of the table, streamed from the store's
   * iterator; the store and its provider close when the rows are exhausted or the task ends.
   */
  private def readPartition(
      stateRoot: String,
      table: StateTable,
      partition: Int,
      version: Long,
      checkpointId: Option[String],
      storeConf: StateStoreConf,
      hadoopConf: Configuration,
      flatten: Boolean): Iterator[InternalRow] = {
    val providerId = StateStoreProviderId(
      StateStoreId(stateRoot, table.operatorId, partition, table.storeName), UUID.randomUUID())
    val provider = StateStoreProvider.createAndInit(providerId, table.storeKeySchema, table.storeValueSchema,
      table.storeSpec, useColumnFamilies = table.columnFamilies, storeConf, hadoopConf,
      useMultipleValuesPerKey = table.columnFamilies, None)
    var store: ReadStateStore = null
    var entries: StateStoreIterator[_] = null
    var closed = false
    def close(): Unit = if (!closed) {
      closed = true
      try if (entries != null) entries.close()
      finally try if (store != null) StoreApi.release(store) finally provider.close()
    }
    Option(TaskContext.get()).foreach(_.addTaskCompletionListener[Unit](_ => close()))
    try {
      store = provider.getReadStore(version, checkpointId)
      val f = table.family
      val present =
        if (!table.columnFamilies) true
        else {
          // Registering tells the store how to decode the family (it may not exist yet).
          SparkShims.registerColFamily(store, f.name, f.keySchema, f.valueSchema, f.spec, f.multipleValues, f.name.startsWith("$"))
          SparkShims.allColumnFamilyNames(store).contains(f.name)
        }
      if (!present) {
        close()
        Iterator.empty
      } else {
        val values: Iterator[PartitionRows.Value] = if (table.lastAccess) {
          val stamped = store match {
            case ours: TaskStateStore => ours.stampedEntries(f.name)
            case other => throw KeyedStateErrors.unsupported(ErrorId.QueryCheckpointInvalid, s"${table.describe} " +
              s"has a TTL: it is read by keyedstate's provider only, not by ${other.getClass.getName}")
          }
          entries = stamped
          stamped.flatMap { case (k, vs) => vs.iterator.map { case (v, stamp) => PartitionRows.Value(k, v, stamp) } }
        } else {
          val pairs = if (f.multipleValues) SparkShims.iteratorWithMultiValues(store, f.name) else store.iterator(f.name)
          entries = pairs
          pairs.map(p => PartitionRows.Value(p.key, p.value, 0L))
        }
        val rows = new PartitionRows(table, partition, flatten).of(values)
        new Iterator[InternalRow] {
          override def hasNext: Boolean = rows.hasNext || { close(); false }
          override def next(): InternalRow = rows.next()
        }
      }
    } catch {
      case NonFatal(e) =>
        close()
        throw e
    }
  }
}

/**
 * One partition's stored values of a table as the rows a read returns (see [[StateReader]]),
 * streamed. Each row holds its own copies: a store's iterator may reuse its rows.
 */
private final class PartitionRows(table: StateTable, partition: Int, flatten: Boolean) {
  import PartitionRows.Value

  private val f = table.family
  private val keyTypes = f.keySchema.fields.map(_.dataType)
  private val valueType = f.valueSchema.head.dataType

  private def row(values: Any*): InternalRow = new GenericInternalRow((partition +: values).toArray[Any])
  private def rowOf(partitionId: Int, values: Any*): InternalRow =
    new GenericInternalRow((partitionId +: values).toArray[Any])
  private def keyValues(key: UnsafeRow, n: Int): Seq[Any] = (0 until n).map(i => key.get(i, keyTypes(i)))
  private def value(v: UnsafeRow): Any = v.get(0, valueType)
  /** The last-access column's value, when the table has one. */
  private def stamped(stamps: => Any): Seq[Any] = if (table.lastAccess) Seq(stamps) else Nil

  def of(values: Iterator[Value]): Iterator[InternalRow] = table.kind match {
    case StateTable.SparkStore => values.map(e => row(e.key.copy(), e.value.copy()))
    case StateTable.Timers => values.map(e => row(keyValues(e.key.copy(), keyTypes.length): _*))
    case kind => StateKind.parse(kind) match {
      case StateKind.OperatorList | StateKind.OperatorUnionList =>
        // A list's partition is the one that wrote it: a rescaled union state's store holds the
        // lists of several old partitions until the restored query joins them.
        values.flatMap { e =>
          val writer = e.key.getInt(0)
          val elements = value(e.value.copy()).asInstanceOf[ArrayData]
          if (flatten) {
            val t = valueType.asInstanceOf[ArrayType].elementType
            (0 until elements.numElements()).iterator.map(i => rowOf(writer, elements.get(i, t)))
          } else Iterator.single(rowOf(writer, elements))
        }
      case StateKind.List if !flatten => grouped(values, keyTypes.length) { (key, entries) =>
        row(key ++ Seq(new GenericArrayData(entries.map(e => value(e.value)).toArray)) ++
          stamped(new GenericArrayData(entries.map(_.stamp).toArray)): _*)
      }
      case StateKind.Map if !flatten => grouped(values, keyTypes.length - 1) { (key, entries) =>
        val mapKeys = entries.map(_.key.get(keyTypes.length - 1, keyTypes.last)).toArray
        row(key ++ Seq(ArrayBasedMapData(mapKeys, entries.map(e => value(e.value)).toArray)) ++
          stamped(ArrayBasedMapData(mapKeys, entries.map(_.stamp).toArray)): _*)
      }
      case _ => values.map { e =>
        row(keyValues(e.key.copy(), keyTypes.length) ++ Seq(value(e.value.copy())) ++ stamped(e.stamp): _*)
      }
    }
  }

  /** Consecutive values whose first `n` key columns are equal, one row each (a key's list
   *  elements and map entries are stored next to each other). */
  private def grouped(values: Iterator[Value], n: Int)(out: (Seq[Any], Seq[Value]) => InternalRow): Iterator[InternalRow] = {
    val in = values.map(e => e.copy(key = e.key.copy(), value = e.value.copy())).buffered
    new Iterator[InternalRow] {
      override def hasNext: Boolean = in.hasNext
      override def next(): InternalRow = {
        val first = in.next()
        val key = keyValues(first.key, n)
        val group = ArrayBuffer(first)
        while (in.hasNext && sameKey(keyValues(in.head.key, n), key)) group += in.next()
        out(key, group.toSeq)
      }
    }
  }

  private def sameKey(a: Seq[Any], b: Seq[Any]): Boolean = a.corresponds(b)(PartitionRows.sameValue)
}

private object PartitionRows {
  /** Whether two decoded column values are equal (binary ones by content). */
  def sameValue(a: Any, b: Any): Boolean = (a, b) match {
    case (x: Array[Byte], y: Array[Byte]) => java.util.Arrays.equals(x, y)
    case (x, y) => x == y
  }

  /** One stored value (a list's element, a map's entry) of a key, with its last-access stamp
   *  (0 when the table has none). */
  final case class Value(key: UnsafeRow, value: UnsafeRow, stamp: Long)
}
