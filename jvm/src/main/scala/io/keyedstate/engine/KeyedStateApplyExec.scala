package io.keyedstate.engine

import java.util.concurrent.TimeUnit.NANOSECONDS

import org.apache.hadoop.conf.Configuration
import org.apache.spark.TaskContext
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions._
import org.apache.spark.sql.catalyst.plans.physical.{Partitioning, UnknownPartitioning}
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.keyedstate.SqlConfScopedRDD
import org.apache.spark.sql.types._
import org.apache.spark.util.AccumulatorV2

import io.keyedstate.TaskStateStore
import io.keyedstate.shims.SparkTypes.{CheckpointFileManager, StateStoreWriter, StatefulOpStateStoreCheckpointInfo, StatefulOperatorStateInfo}

/**
 * Consumes what the Python function returned for one partition: output rows go on, state
 * mutations go into the store the lookup node opened in this task. When the partition is done
 * it notes the earliest pending timers (for Spark's no-data batches) and commits the store.
 * A `StateStoreWriter`, so Spark records its metadata and schema, reports its metrics, collects
 * its checkpoint ids (format v2) and asks it whether another batch should run.
 */
final case class KeyedStateApplyExec(
    specJson: String,
    inputSchema: StructType,
    output: Seq[Attribute],
    context: Option[BatchContext],
    child: SparkPlan) extends UnaryExecNode with StateStoreWriter {

  @transient private lazy val spec = ProcessSpec.fromJson(specJson)

  override def stateInfo: Option[StatefulOperatorStateInfo] = context.map(_.stateInfo)

  override def shortName: String = KeyedProcessOperators.ShortName

  override def simpleString(maxFields: Int): String =
    s"KeyedStateApply ${spec.functionName} by ${spec.keyColumns.mkString(", ")}" +
      stateInfo.map(i => s", operator ${i.operatorId}").getOrElse("")

  override def outputPartitioning: Partitioning = UnknownPartitioning(child.outputPartitioning.numPartitions)

  override def producedAttributes: AttributeSet = AttributeSet(output)

  override protected def withNewChildInternal(newChild: SparkPlan): KeyedStateApplyExec = copy(child = newChild)

  // The earliest pending timer of any partition after the last batch: Spark runs a no-data batch
  // when one falls due (event time: the new watermark; processing time: the clock).
  @transient private lazy val nextEventTimer = registered(new MinLongAccumulator, "nextEventTimer")
  @transient private lazy val nextProcTimer = registered(new MinLongAccumulator, "nextProcTimer")

  private def registered(acc: MinLongAccumulator, name: String): MinLongAccumulator = {
    sparkContext.register(acc, s"keyedstate.$name")
    acc
  }

  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    spec.timers && (nextEventTimer.value <= newInputWatermark ||
      nextProcTimer.value <= System.currentTimeMillis())

  override def validateAndMaybeEvolveStateSchema(
      hadoopConf: Configuration,
      batchId: Long,
      stateSchemaVersion: Int): List[StateSchemaValidationResult] = {
    // The declaration lives in each version's manifest: nothing to write here, a check before any
    // task. Spark takes one result per store; its path names where the declaration is kept.
    val info = getStateInfo
    OperatorDeclaration.checkAtStart(OperatorDeclaration.of(spec, inputSchema), info, hadoopConf)
    // Spark's purge of version-2 operator metadata lists the schema folder: it must exist.
    val schemaDir = stateSchemaDirPath()
    CheckpointFileManager.create(schemaDir, hadoopConf).mkdirs(schemaDir)
    List(StateSchemaValidationResult(evolvedSchema = false,
      new org.apache.hadoop.fs.Path(info.checkpointLocation, info.operatorId.toString).toString))
  }

  /**
   * Version 2 of Spark's operator metadata, for its properties: Spark's `state-metadata` reader
   * shows which keyed function (function, uid, key columns, states) each operator is.
   */
  override def operatorStateMetadataVersion: Int = 2

  override def operatorStateMetadata(stateSchemaPaths: List[List[String]]): OperatorStateMetadata = {
    val info = getStateInfo
    OperatorStateMetadataV2(OperatorInfoV1(info.operatorId, shortName),
      Array(StateStoreMetadataV2(StateStoreId.DEFAULT_STORE_NAME, 0, info.numPartitions,
        stateSchemaPaths.headOption.getOrElse(Nil))),
      org.json4s.jackson.JsonMethods.compact(OperatorDeclaration.of(spec, inputSchema).toJson))
  }

  override protected def doExecute(): RDD[InternalRow] = {
    val info = getStateInfo
    val specCopy = spec
    val outSchema = Exchange.outSchema(spec, inputSchema)
    val numOutput = output.length
    val outputRefs = output.zipWithIndex.map { case (a, i) => BoundReference(i + 1, a.dataType, nullable = true) }
    val layout = new StateLayout(spec, inputSchema)
    val eventAcc = nextEventTimer
    val procAcc = nextProcTimer
    val numOutputRows = longMetric("numOutputRows")
    val numUpdated = longMetric("numUpdatedStateRows")
    val numRemoved = longMetric("numRemovedStateRows")
    val updatesTime = longMetric("allUpdatesTimeMs")
    val commitTime = longMetric("commitTimeMs")

    // Arrow batches to Python are bounded by rows (spark.sql.execution.arrow.maxRecordsPerBatch)
    // and not also by bytes: Spark's byte bound measures every vector after every row.
    val input = new SqlConfScopedRDD(child.execute(), Map(SQLConf.ARROW_EXECUTION_MAX_BYTES_PER_BATCH.key -> Int.MaxValue.toString))
    input.mapPartitionsWithIndex { (partition, rows) =>
      val task = TaskContext.get()
      val store = StoreHandoff.take(task.taskAttemptId(), info.operatorId)
      val writer = new MutationWriter(specCopy, layout, store, partition, outSchema, numOutput)
      val outputProjection = UnsafeProjection.create(outputRefs)
      val start = System.nanoTime()
      new Iterator[InternalRow] {
        private var nextRow: InternalRow = _
        private var finished = false

        private def advance(): Unit = {
          while (nextRow == null && rows.hasNext) {
            val row = rows.next()
            if (row.getByte(0) == Exchange.Output) nextRow = outputProjection(row)
            else writer(row)
          }
          if (nextRow == null && !finished) {
            finished = true
            finish()
          }
        }

        private def finish(): Unit = {
          updatesTime += NANOSECONDS.toMillis(System.nanoTime() - start)
          if (specCopy.timers) {
            writer.firstTimer(layout.eventTimers.name).foreach(eventAcc.add)
            writer.firstTimer(layout.procTimers.name).foreach(procAcc.add)
          }
          numUpdated += writer.updated
          numRemoved += writer.removed
          commitTime += timeTakenMs { store.commit() }
          setStoreMetrics(store)
          val ckpt = store.getStateStoreCheckpointInfo()
          setStateStoreCheckpointInfo(StatefulOpStateStoreCheckpointInfo(ckpt.partitionId, ckpt.batchVersion,
            ckpt.stateStoreCkptId.map(Array(_)), ckpt.baseStateStoreCkptId.map(Array(_))))
        }

        override def hasNext: Boolean = {
          if (nextRow == null && !finished) advance()
          nextRow != null
        }

        override def next(): InternalRow = {
          if (!hasNext) throw new NoSuchElementException
          val row = nextRow
          nextRow = null
          numOutputRows += 1
          row
        }
      }
    }
  }
}

/** Applies one partition's state changes to its store (row layout: [[Exchange.outSchema]]). */
private final class MutationWriter(
    spec: ProcessSpec,
    layout: StateLayout,
    store: TaskStateStore,
    partition: Int,
    outSchema: StructType,
    numOutput: Int) {

  var updated = 0L
  var removed = 0L

  private val columns: Map[String, Int] = outSchema.fieldNames.zipWithIndex.toMap
  private val outTypes = outSchema.fields.map(_.dataType)

  private val keyOffset = 1 + numOutput
  private val numKeys = layout.numKeyColumns
  private val timeOrdinal = columns(Exchange.TimeColumn)
  private val keyProjection = UnsafeProjection.create(
    (0 until numKeys).map(i => BoundReference(keyOffset + i, outTypes(keyOffset + i), nullable = true)))
  private val timerKeyProjection = UnsafeProjection.create(
    BoundReference(timeOrdinal, LongType, nullable = false) +:
      (0 until numKeys).map(i => BoundReference(keyOffset + i, outTypes(keyOffset + i), nullable = true)))
  private val timerValue = UnsafeProjection.create(Array[DataType](BooleanType))(InternalRow(true)).copy()
  private val partitionKey = OperatorLists.partitionKey(partition)

  // Per state variable: where its cells are, and projections to its stored rows. One small
  // writer per kind: each is compiled on its own when it gets hot.
  private abstract class VarWriter(val v: StateVar, i: Int) {
    val cf: String = v.columnFamily
    val opOrdinal: Int = columns(Exchange.opColumn(i))
    protected val dataOrdinal: Int = columns(Exchange.stateColumn(i))
    private val element = UnsafeProjection.create(Seq(BoundReference(0, v.valueType, nullable = true)))
    private val one = new GenericInternalRow(1)

    /** A value, element or map value as the stored row. */
    protected def elementRow(x: Any): UnsafeRow = { one.update(0, x); element(one) }

    def apply(op: Byte, key: UnsafeRow, row: InternalRow): Unit

    protected def undefined(op: Byte): Nothing =
      throw new IllegalStateException(s"keyedstate: change $op is not defined for ${v.kind.name} state '${v.name}'")
  }

  private final class ValueWriter(v: StateVar, i: Int) extends VarWriter(v, i) {
    private val value = UnsafeProjection.create(Seq(BoundReference(dataOrdinal, v.valueType, nullable = true)))

    def apply(op: Byte, key: UnsafeRow, row: InternalRow): Unit = op match {
      case Exchange.Put => store.put(key, value(row), cf); updated += 1
      case Exchange.Clear => store.remove(key, cf); removed += 1
      case _ => undefined(op)
    }
  }

  private final class ListWriter(v: StateVar, i: Int) extends VarWriter(v, i) {
    private def elements(row: InternalRow): Array[UnsafeRow] = {
      val array = row.getArray(dataOrdinal)
      Array.tabulate(array.numElements())(j => elementRow(array.get(j, v.valueType)).copy())
    }

    def apply(op: Byte, key: UnsafeRow, row: InternalRow): Unit = op match {
      case Exchange.Put =>
        val values = elements(row)
        if (values.isEmpty) store.remove(key, cf) else store.putList(key, values, cf)
        updated += 1
      case Exchange.Append =>
        val values = elements(row)
        if (values.nonEmpty) store.mergeList(key, values, cf)
        updated += 1
      case Exchange.Clear => store.remove(key, cf); removed += 1
      case _ => undefined(op)
    }
  }

  /**
   * A key's map state, or (`perKey` false) the partition's broadcast state: one map, its entries
   * keyed by the map key alone.
   */
  private final class MapWriter(v: StateVar, i: Int, perKey: Boolean) extends VarWriter(v, i) {
    private val removedOrdinal = columns(Exchange.removedColumn(i))
    private val mapKeyType = v.mapKeyType.get
    private val width = if (perKey) numKeys else 0
    // A map entry's key: the key's columns (none for broadcast state) and the map key.
    private val entryKey = UnsafeProjection.create(
      (0 until width).map(k => BoundReference(k, layout.keySchema(k).dataType, nullable = true)) :+
        BoundReference(width, mapKeyType, nullable = true))
    private val mapKeyRow = new GenericInternalRow(1)
    private val joined = new JoinedRow()

    private def entry(key: UnsafeRow, mapKey: Any): UnsafeRow = {
      mapKeyRow.update(0, mapKey)
      if (perKey) entryKey(joined(key, mapKeyRow)) else entryKey(mapKeyRow)
    }

    def apply(op: Byte, key: UnsafeRow, row: InternalRow): Unit = {
      op match {
        case Exchange.Put => removeEntries(key, row)
        case Exchange.Clear => clear(key)
        case _ => undefined(op)
      }
      putEntries(key, row)
    }

    private def clear(key: UnsafeRow): Unit = {
      val it = if (perKey) store.prefixScan(key, cf) else store.iterator(cf)
      val entries = try it.map(_.key.copy()).toArray finally it.close()
      entries.foreach(store.remove(_, cf))
      removed += entries.length
    }

    private def removeEntries(key: UnsafeRow, row: InternalRow): Unit = if (!row.isNullAt(removedOrdinal)) {
      val gone = row.getArray(removedOrdinal)
      var j = 0
      while (j < gone.numElements()) {
        store.remove(entry(key, gone.get(j, mapKeyType)), cf)
        removed += 1
        j += 1
      }
    }

    private def putEntries(key: UnsafeRow, row: InternalRow): Unit = if (!row.isNullAt(dataOrdinal)) {
      val puts = row.getMap(dataOrdinal)
      val (keys, values) = (puts.keyArray(), puts.valueArray())
      var j = 0
      while (j < puts.numElements()) {
        store.put(entry(key, keys.get(j, mapKeyType)), elementRow(values.get(j, v.valueType)), cf)
        updated += 1
        j += 1
      }
    }
  }

  private final class OperatorListWriter(v: StateVar, i: Int) extends VarWriter(v, i) {
    // The data cell holds the whole list.
    private val value = UnsafeProjection.create(
      Seq(BoundReference(dataOrdinal, ArrayType(v.valueType, containsNull = false), nullable = true)))

    def apply(op: Byte, key: UnsafeRow, row: InternalRow): Unit = op match {
      case Exchange.Put =>
        // The snapshot replaces every list the lookup merged (see KeyedStateLookupExec).
        OperatorLists.replace(store, cf, partitionKey, value(row))
        updated += 1
      case _ => undefined(op)
    }
  }

  private val vars: Array[VarWriter] = spec.states.zipWithIndex.map { case (v, i) =>
    v.kind match {
      case StateKind.Value => new ValueWriter(v, i)
      case StateKind.List => new ListWriter(v, i)
      case StateKind.Map => new MapWriter(v, i, perKey = true)
      case StateKind.Broadcast => new MapWriter(v, i, perKey = false)
      case StateKind.OperatorList | StateKind.OperatorUnionList => new OperatorListWriter(v, i)
    }
  }.toArray
  private val keyedVars = vars.filterNot(_.v.kind.isPartitionLevel)
  private val operatorVars = vars.filter(_.v.kind.isPartitionLevel)

  def apply(row: InternalRow): Unit = row.getByte(0) match {
    case Exchange.KeyChanges => changes(keyedVars, keyProjection(row), row)
    case Exchange.OperatorStates => changes(operatorVars, partitionKey, row)
    case Exchange.RegisterEventTimer => store.put(timerKeyProjection(row), timerValue, layout.eventTimers.name); updated += 1
    case Exchange.RegisterProcTimer => store.put(timerKeyProjection(row), timerValue, layout.procTimers.name); updated += 1
    case Exchange.DeleteEventTimer => store.remove(timerKeyProjection(row), layout.eventTimers.name); removed += 1
    case Exchange.DeleteProcTimer => store.remove(timerKeyProjection(row), layout.procTimers.name); removed += 1
    case other => throw new IllegalStateException(s"keyedstate: unknown row kind $other from the Python function")
  }

  // The key projection's row is reused by the next row only: each variable's writes use it now.
  private def changes(writers: Array[VarWriter], key: UnsafeRow, row: InternalRow): Unit = {
    var i = 0
    while (i < writers.length) {
      val w = writers(i)
      if (!row.isNullAt(w.opOrdinal)) w.apply(row.getByte(w.opOrdinal), key, row)
      i += 1
    }
  }

  /** The earliest timer of a timer column family, if any. */
  def firstTimer(cf: String): Option[Long] = {
    val it = store.iterator(cf)
    try if (it.hasNext) Some(it.next().key.getLong(0)) else None finally it.close()
  }
}

/** The minimum of the values added (Long.MaxValue when none was). */
final class MinLongAccumulator extends AccumulatorV2[Long, Long] {
  private var min = Long.MaxValue
  override def isZero: Boolean = min == Long.MaxValue
  override def copy(): MinLongAccumulator = { val c = new MinLongAccumulator; c.min = min; c }
  override def reset(): Unit = min = Long.MaxValue
  override def add(v: Long): Unit = if (v < min) min = v
  override def merge(other: AccumulatorV2[Long, Long]): Unit = add(other.value)
  override def value: Long = min
}
