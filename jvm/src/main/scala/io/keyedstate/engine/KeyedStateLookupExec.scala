package io.keyedstate.engine

import java.util

import scala.collection.mutable

import org.apache.spark.{SparkEnv, TaskContext}
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions._
import org.apache.spark.sql.catalyst.plans.physical._
import org.apache.spark.sql.catalyst.util.{ArrayBasedMapData, GenericArrayData}
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types._
import org.apache.spark.util.SerializableConfiguration

import io.keyedstate.TaskStateStore

/**
 * Opens a partition's state store and streams to Python, key by key (the input arrives
 * clustered by Spark's state partitioning and sorted by key): a header row with the batch's
 * times, the partition's operator state (operator lists, broadcast maps), the broadcast stream's
 * elements (a second child, collected and sent whole to every task), then per key a row with all its
 * state, its due timers and its input rows; keys with due timers but no input come last. The
 * store is handed to the apply node of the same task, which writes and commits it.
 */
final case class KeyedStateLookupExec(
    specJson: String,
    inputSchema: StructType,
    output: Seq[Attribute],
    context: Option[BatchContext],
    child: SparkPlan,
    broadcast: Option[SparkPlan]) extends SparkPlan {

  override def children: Seq[SparkPlan] = child +: broadcast.toSeq

  @transient private lazy val spec = ProcessSpec.fromJson(specJson)

  private def keyExpressions: Seq[Expression] =
    spec.keyColumns.map(c => child.output.find(_.name == c).getOrElse(
      throw new IllegalStateException(s"key column $c is not in the input ${child.output}")))

  // The broadcast stream's micro-batch is collected by doExecute itself, not by a broadcast
  // exchange: most micro-batches of a low-rate stream are empty, and an exchange would still run
  // a job and create a broadcast for each.
  override def requiredChildDistribution: Seq[Distribution] = (context match {
    case Some(c) => StatefulOpClusteredDistribution(keyExpressions, c.stateInfo.numPartitions)
    case None => ClusteredDistribution(keyExpressions)
  }) +: broadcast.toSeq.map(_ => UnspecifiedDistribution)

  override def requiredChildOrdering: Seq[Seq[SortOrder]] = {
    val byKey = keyExpressions.map(SortOrder(_, Ascending))
    val byOrder = spec.orderBy.toSeq.map(c => SortOrder(child.output.find(_.name == c).get, Ascending))
    (byKey ++ byOrder) +: broadcast.toSeq.map(_ => Nil)
  }

  // Rows of new attributes: the child's partitioning no longer names them.
  override def outputPartitioning: Partitioning = UnknownPartitioning(child.outputPartitioning.numPartitions)

  override def producedAttributes: AttributeSet = AttributeSet(output)

  override def simpleString(maxFields: Int): String =
    s"KeyedStateLookup ${spec.functionName} by ${spec.keyColumns.mkString(", ")}" +
      context.map(c => s", operator ${c.stateInfo.operatorId}").getOrElse("")

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[SparkPlan]): KeyedStateLookupExec =
    copy(child = newChildren.head, broadcast = broadcast.map(_ => newChildren(1)))

  override protected def doExecute(): RDD[InternalRow] = {
    val batch = context.getOrElse(throw new IllegalStateException(
      s"keyed function ${spec.functionName} runs only in a streaming query started with writeStream"))
    val info = batch.stateInfo
    val watermark = KeyedProcessOperators.inputWatermark(session, batch)
    val layout = new StateLayout(spec, inputSchema)
    val declaration = OperatorDeclaration.of(spec, inputSchema)
    val storeConf = new StateStoreConf(conf, StoreOptions.ttlOptions(spec.states, info.operatorId))
    StoreOptions.checkPythonRunner(spec, info.operatorId, storeConf,
      pipelined = SparkEnv.get.conf.getBoolean(StoreOptions.PipelinedRunnerKey, defaultValue = false))
    // Broadcast, as Spark's StateStoreRDD does: in a task's closure every task would carry and
    // deserialize the whole Hadoop configuration (hundreds of entries).
    val hadoopConf = session.sparkContext.broadcast(
      new SerializableConfiguration(KeyedProcessSqlBridge.hadoopConf(session)))
    val exchange = Exchange.inSchema(spec, inputSchema)
    val specCopy = spec
    val inputTypes = inputSchema.fields.map(_.dataType)
    val childOutput = child.output
    val keyOrdinals = specCopy.keyColumns.map(c => inputSchema.fieldIndex(c))
    // Every element of the broadcast stream's micro-batch, in one order every task sees. A batch
    // without any (a source without new data is an empty local relation) runs no job and
    // broadcasts nothing.
    val broadcastElements = broadcast.map(_.executeCollect()).filter(_.nonEmpty)
      .map(rows => session.sparkContext.broadcast(rows))
    val broadcastTypes = specCopy.broadcastSchema.map(_.fields.map(_.dataType)).getOrElse(Array.empty[DataType])
    // A run's first batch restores union state: every partition runs its function then, also
    // without input, so that each snapshots its own list, as every Flink subtask does.
    val restoring = batch.firstOfRun && spec.unionStates.nonEmpty
    val unionLists =
      if (batch.firstOfRun) UnionListRestore.read(spec, info, KeyedProcessSqlBridge.hadoopConf(session))
      else Map.empty[String, Array[Byte]]

    val queryable = specCopy.queryableStates.nonEmpty
    child.execute().mapPartitionsWithIndex { (partition, rows) =>
      val store = StoreAccess.open(info, partition, layout, declaration, queryable, storeConf,
        hadoopConf.value.value)
      val task = TaskContext.get()
      StoreHandoff.put(task.taskAttemptId(), info.operatorId, store)
      task.addTaskCompletionListener[Unit] { _ =>
        StoreHandoff.drop(task.taskAttemptId(), info.operatorId)
        if (!store.hasCommitted) store.abort()
      }
      // A restore gives every partition the union lists before anything reads them.
      if (unionLists.nonEmpty) {
        val partitionKey = OperatorLists.partitionKey(partition)
        unionLists.foreach { case (cf, bytes) => OperatorLists.replace(store, cf, partitionKey, UnionListRestore.row(bytes)) }
      }
      new LookupIterator(specCopy, layout, store, partition, info.numPartitions, batch.batchTimestampMs,
        watermark, exchange, inputTypes, keyOrdinals, childOutput, rows,
        broadcastElements.fold(Array.empty[InternalRow])(_.value), broadcastTypes, restoring)
    }
  }
}

/** Produces the rows Python reads for one partition (see [[KeyedStateLookupExec]]). */
private final class LookupIterator(
    spec: ProcessSpec,
    layout: StateLayout,
    store: TaskStateStore,
    partition: Int,
    numPartitions: Int,
    nowMs: Long,
    watermarkMs: Long,
    exchange: StructType,
    inputTypes: Array[DataType],
    keyOrdinals: Seq[Int],
    childOutput: Seq[Attribute],
    input: Iterator[InternalRow],
    broadcastElements: Array[InternalRow],
    broadcastTypes: Array[DataType],
    restoring: Boolean) extends Iterator[InternalRow] {

  private val InputOffset = 4
  private val broadcastOffset = InputOffset + inputTypes.length
  private val stateOffset = broadcastOffset + broadcastTypes.length
  private val width = exchange.length
  private val toUnsafe = UnsafeProjection.create(exchange)

  // List and map columns are never null: an absent list, map or operator list is empty. Spark
  // measures a mapInArrow batch's bytes after every row, and Arrow's ListVector.setValueCount
  // then refills every null slot since the last non-null list: runs of nulls made each batch
  // quadratic. Value states of a list or map type stay null when absent (None is not []) and
  // are empty on the rows of other kinds.
  private val emptyNested: Array[(Int, Any)] = exchange.fields.zipWithIndex.drop(stateOffset).collect {
    case (f, i) if f.dataType.isInstanceOf[ArrayType] => i -> new GenericArrayData(Array.empty[Any])
    case (f, i) if f.dataType.isInstanceOf[MapType] =>
      i -> ArrayBasedMapData(Array.empty[Any], Array.empty[Any])
  }

  private val keyProjection = UnsafeProjection.create(
    keyOrdinals.map(i => BoundReference(i, inputTypes(i), nullable = true)))
  private val pending = new util.ArrayDeque[InternalRow]()
  private var started = false
  private var currentKey: UnsafeRow = _

  // Due timers, read once before any write: key → (kind, time) in firing order.
  private val dueTimers: mutable.LinkedHashMap[UnsafeRow, mutable.ArrayBuffer[(Byte, Long)]] =
    if (!spec.timers) mutable.LinkedHashMap.empty
    else {
      val due = mutable.LinkedHashMap.empty[UnsafeRow, mutable.ArrayBuffer[(Byte, Long)]]
      collectDue(layout.eventTimers.name, watermarkMs, Exchange.EventTimer, due)
      collectDue(layout.procTimers.name, nowMs, Exchange.ProcTimer, due)
      due
    }
  private var leftoverTimers: Iterator[(UnsafeRow, mutable.ArrayBuffer[(Byte, Long)])] = _

  // Per state variable, whether its column family stored anything when the batch started, also
  // checked before any write: one that held nothing (a first batch, a state no key has used yet)
  // has no value for any key, so no key's value is read from it. Each key comes once per batch
  // (the input is sorted by key), so a write of this batch never concerns a key read after it.
  // A TTL'd family is read as usual: finding a live entry in it could scan many expired ones.
  private val storedAtStart: Array[Boolean] = spec.states.map { v =>
    v.kind.isPartitionLevel || v.ttl.isDefined || {
      val it = if (v.kind == StateKind.List) store.iteratorWithMultiValues(v.columnFamily)
        else store.iterator(v.columnFamily)
      try it.hasNext finally it.close()
    }
  }.toArray

  private def collectDue(cf: String, upTo: Long, kind: Byte,
      into: mutable.LinkedHashMap[UnsafeRow, mutable.ArrayBuffer[(Byte, Long)]]): Unit = {
    val keyOfTimer = UnsafeProjection.create(layout.keySchema.fields.indices.map(i =>
      BoundReference(i + 1, layout.keySchema(i).dataType, nullable = true)))
    val it = store.iterator(cf)
    try {
      var done = false
      while (!done && it.hasNext) {
        val pair = it.next()
        val ts = pair.key.getLong(0)
        if (ts > upTo) done = true
        else into.getOrElseUpdate(keyOfTimer(pair.key).copy(), mutable.ArrayBuffer.empty) += ((kind, ts))
      }
    } finally it.close()
  }

  private def emit(row: InternalRow): Unit = {
    var j = 0
    while (j < emptyNested.length) {
      val (i, empty) = emptyNested(j)
      if (row.isNullAt(i) && !(row.getByte(0) == Exchange.Key && isValueState(i))) row.update(i, empty)
      j += 1
    }
    pending.add(toUnsafe(row).copy())
  }

  private val valueStateColumns: Set[Int] =
    spec.states.zipWithIndex.collect { case (v, i) if v.kind == StateKind.Value => stateOffset + i }.toSet
  private def isValueState(column: Int): Boolean = valueStateColumns(column)

  private def header(): Unit = {
    val row = new GenericInternalRow(width)
    row.update(0, Exchange.Batch)
    row.update(1, nowMs)
    row.update(2, watermarkMs)
    row.update(3, numPartitions)
    emit(row)
    if (spec.partitionStates.nonEmpty) {
      val ops = new GenericInternalRow(width)
      ops.update(0, Exchange.OperatorState)
      // Every list stored in this partition: its own, one per old partition of a rescaled union
      // state until the restore joins them (see UnionListRestore), joined in partition order.
      spec.operatorStates.foreach { case (v, i) =>
        val it = store.iterator(v.columnFamily)
        val lists = try it.map(p => (p.key.getInt(0), p.value.copy().getArray(0))).toVector finally it.close()
        if (lists.nonEmpty) {
          val elements = lists.sortBy(_._1).flatMap { case (_, a) => a.toSeq[Any](v.valueType) }
          ops.update(stateOffset + i, new GenericArrayData(elements.toArray))
        }
      }
      spec.broadcastStates.foreach { case (v, i) => ops.update(stateOffset + i, readMap(v.columnFamily, null, 0, v)) }
      emit(ops)
    }
    // apply_to_keyed_state visits every stored key while the broadcast elements are processed.
    if (spec.visitsKeyedState && broadcastElements.nonEmpty) storedKeys().foreach(keyRow(_, Exchange.VisitedKey))
    broadcastElements.foreach { element =>
      val row = new GenericInternalRow(width)
      row.update(0, Exchange.BroadcastElement)
      broadcastTypes.indices.foreach(j => row.update(broadcastOffset + j, element.get(j, broadcastTypes(j))))
      emit(row)
    }
  }

  /** The key row: key columns at their input positions, then the value of every keyed state. */
  private def keyRow(key: UnsafeRow, kind: Byte = Exchange.Key): Unit = {
    val row = new GenericInternalRow(width)
    row.update(0, kind)
    keyOrdinals.zipWithIndex.foreach { case (ordinal, i) =>
      row.update(InputOffset + ordinal, key.get(i, inputTypes(ordinal)))
    }
    spec.keyedStates.foreach { case (v, i) => if (storedAtStart(i)) row.update(stateOffset + i, readState(v, key)) }
    emit(row)
  }

  private def readState(v: StateVar, key: UnsafeRow): Any = v.kind match {
    case StateKind.Value =>
      val value = store.get(key, v.columnFamily)
      if (value == null) null else value.copy().get(0, v.valueType)
    case StateKind.List =>
      val values = store.valuesIterator(key, v.columnFamily).map(_.copy().get(0, v.valueType)).toArray
      if (values.isEmpty) null else new GenericArrayData(values)
    case StateKind.Map => readMap(v.columnFamily, key, layout.numKeyColumns, v)
    case StateKind.OperatorList | StateKind.OperatorUnionList | StateKind.Broadcast => null
  }

  /** Every key with some keyed state stored, once each, in the order the families give them. */
  private def storedKeys(): Iterable[UnsafeRow] = {
    val keys = mutable.LinkedHashSet.empty[UnsafeRow]
    val prefix = UnsafeProjection.create(layout.keySchema.fields.indices.map(i =>
      BoundReference(i, layout.keySchema(i).dataType, nullable = true)))
    spec.keyedStates.foreach { case (v, _) =>
      val it = v.kind match {
        case StateKind.List => store.iteratorWithMultiValues(v.columnFamily)
        case _ => store.iterator(v.columnFamily)
      }
      try it.foreach { pair =>
        keys += (if (v.kind == StateKind.Map) prefix(pair.key).copy() else pair.key.copy())
      } finally it.close()
    }
    keys
  }

  /** A map: a key's map state (the entries under `prefix`), or a broadcast state (`prefix` null: all). */
  private def readMap(cf: String, prefix: UnsafeRow, mapKeyOrdinal: Int, v: StateVar): Any = {
    val keyType = v.mapKeyType.get
    val it = if (prefix == null) store.iterator(cf) else store.prefixScan(prefix, cf)
    val keys = mutable.ArrayBuffer.empty[Any]
    val values = mutable.ArrayBuffer.empty[Any]
    try it.foreach { pair =>
      keys += pair.key.copy().get(mapKeyOrdinal, keyType)
      values += pair.value.copy().get(0, v.valueType)
    } finally it.close()
    if (keys.isEmpty) null else ArrayBasedMapData(keys.toArray, values.toArray)
  }

  private def timerRows(timers: Iterable[(Byte, Long)]): Unit = timers.foreach { case (kind, ts) =>
    val row = new GenericInternalRow(width)
    row.update(0, kind)
    row.update(1, ts)
    emit(row)
  }

  // Element rows, the bulk, are generated code from the input row straight to the exchange row:
  // no generic row, no copy (Spark's Arrow writer consumes a row before asking for the next).
  private val elementProjection: UnsafeProjection = {
    val fields = exchange.fields
    val exprs = fields.indices.map { i =>
      if (i == 0) Literal(Exchange.Element, ByteType)
      else if (i >= InputOffset && i < broadcastOffset) {
        BoundReference(i - InputOffset, inputTypes(i - InputOffset), nullable = true)
      } else emptyNested.collectFirst { case (j, empty) if j == i => Literal(empty, fields(i).dataType) }
        .getOrElse(Literal(null, fields(i).dataType))
    }
    UnsafeProjection.create(exprs)
  }
  private var nextElement: InternalRow = _

  private def fill(): Unit = {
    if (!started) {
      started = true
      // A partition without input still takes the broadcast elements (every partition's
      // broadcast state stays the same) and, restoring, its union lists.
      if (input.hasNext || dueTimers.nonEmpty || broadcastElements.nonEmpty || restoring) header()
    }
    if (pending.isEmpty && nextElement == null && input.hasNext) {
      val in = input.next()
      val key = keyProjection(in)
      if (currentKey == null || key != currentKey) {
        currentKey = key.copy()
        keyRow(currentKey)
        dueTimers.remove(currentKey).foreach(timerRows)
      }
      nextElement = in // valid until input.next() is called again
    }
    if (pending.isEmpty && nextElement == null && !input.hasNext) {
      if (leftoverTimers == null) leftoverTimers = dueTimers.iterator
      if (leftoverTimers.hasNext) {
        val (key, timers) = leftoverTimers.next()
        keyRow(key)
        timerRows(timers)
      }
    }
  }

  override def hasNext: Boolean = {
    if (pending.isEmpty && nextElement == null) fill()
    !pending.isEmpty || nextElement != null
  }

  override def next(): InternalRow = {
    if (!hasNext) throw new NoSuchElementException
    if (!pending.isEmpty) pending.poll()
    else {
      val row = elementProjection(nextElement)
      nextElement = null
      row
    }
  }
}
