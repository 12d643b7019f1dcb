package io.keyedstate.queryable

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection
import org.apache.spark.sql.execution.streaming.state.{NoPrefixKeyStateEncoderSpec, StateStoreConf, StateStoreId}
import org.apache.spark.sql.types._
import org.json4s._
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.StorePartition
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.engine.{Family, KeyedStateApplyExec, PickledParts, ProcessSpec, StateKind, StateLayout}
import io.keyedstate.offline.{QueryCheckpoint, StateTables}
import io.keyedstate.rocks.{ColumnFamilyCodec, KeyGroupHasher, KeyGroups}
import io.keyedstate.shims.SparkTypes.{IncrementalExecution, StateStoreWriter, StreamExecution}

/** What a lookup of a key answers, by how the state is stored. */
sealed trait Answer
object Answer {
  /** One value (value, reducing, aggregating state): the stored row's `value` column. */
  case object Value extends Answer
  /** The elements of a list state. */
  case object Elements extends Answer
  /** The entries of a map state, read by the key's prefix. */
  case object Entries extends Answer
  /** The whole value row of a store of Spark's operators (an aggregation's buffer, a group's state). */
  case object Row extends Answer
}

/**
 * One queryable state of a running query: a keyed function's state (`set_queryable`) or the
 * store of one of Spark's operators (`keyedstate.queryable`). Where it lives (operator,
 * partition count, checkpoint, store) and how its keys and values are stored (`family`, whose key
 * starts with the lookup's `keySchema` columns; `routing`, the key columns the query's shuffle
 * hashes). Each thread has a codec of its own ([[withCodec]]).
 */
final class QueryableState(
    val name: String,
    val kind: String,
    val owner: String,
    val operatorId: Long,
    val numPartitions: Int,
    val checkpointRoot: String,
    val storeName: String,
    val answer: Answer,
    val keySchema: StructType,
    routing: Seq[Int],
    family: Family,
    val valueType: DataType,
    val mapKeyType: Option[DataType],
    val pickled: PickledParts) {

  def partition(p: Int): StorePartition = StorePartition(checkpointRoot, operatorId, p, storeName)

  def column: String = family.name

  // One codec per thread: Spark's encoders reuse their rows, and a lookup on the HTTP server's
  // dispatcher thread must not wait for another thread's long decode.
  private val codecs = ThreadLocal.withInitial[Codec](() => new Codec)

  def withCodec[T](f: Codec => T): T = f(codecs.get())

  /** The codec's calls, valid inside [[withCodec]]. */
  final class Codec private[QueryableState] {
    private val codec = new ColumnFamilyCodec(storeName, family.name, family.keySchema, family.valueSchema,
      family.spec, family.multipleValues, isInternal = false)
    private val toUnsafe = UnsafeProjection.create(keySchema)
    // A map entry's stored key: the key columns, then the map key.
    private lazy val toEntryKey = UnsafeProjection.create(family.keySchema)
    private val hasher = new KeyGroupHasher(keySchema, routing)

    /** The partition owning `key` (the key columns' row) and its stored key (a map's: its entries' prefix). */
    def locate(key: InternalRow): (Int, Array[Byte]) = {
      val row = toUnsafe(key)
      val owner = KeyGroups.owner(hasher.tag(row), numPartitions)
      (owner, if (answer == Answer.Entries) codec.encodePrefix(row) else codec.encodeKey(row))
    }

    /** The partition owning `key` and the stored key of its map entry `mapKey` (a map state's). */
    def locateEntry(key: InternalRow, mapKey: Any): (Int, Array[Byte]) = {
      val owner = KeyGroups.owner(hasher.tag(toUnsafe(key)), numPartitions)
      val values = (0 until keySchema.length).map(i => key.get(i, keySchema(i).dataType)) :+ mapKey
      (owner, codec.encodeKey(toEntryKey(InternalRow.fromSeq(values))))
    }

    /** A map entry's stored value as JSON. */
    def entryValueJson(bytes: Array[Byte]): JValue =
      if (bytes == null) JNull else JsonValues.toJson(codec.decodeValue(bytes), 0, valueType)

    /** A stored value as JSON: the value, the list of elements, or the value row. */
    def valueJson(bytes: Array[Byte]): JValue =
      if (bytes == null) JNull
      else answer match {
        case Answer.Elements => JArray(codec.decodeValues(bytes).toList.map(JsonValues.toJson(_, 0, valueType)))
        case Answer.Row => JsonValues.rowJson(codec.decodeValue(bytes), family.valueSchema)
        case _ => JsonValues.toJson(codec.decodeValue(bytes), 0, valueType)
      }

    /** A map entry's map key, as the map key's type holds it (a copy: the codec reuses its rows). */
    def entryMapKey(key: Array[Byte]): Any =
      InternalRow.copyValue(codec.decodeKey(key).get(keySchema.length, mapKeyType.get))

    /** A map entry as `[map key, value]`. */
    def entryJson(key: Array[Byte], value: Array[Byte]): JValue =
      JArray(List(JsonValues.toJson(codec.decodeKey(key), keySchema.length, mapKeyType.get),
        JsonValues.toJson(codec.decodeValue(value), 0, valueType)))
  }

  def toJson: JValue =
    ("name" -> name) ~ ("kind" -> kind) ~ ("function" -> owner) ~ ("operator" -> operatorId) ~
      ("partitions" -> numPartitions) ~
      ("key_columns" -> JArray(keySchema.fields.toList.map(f =>
        ("name" -> f.name) ~ ("type" -> JsonMethods.parse(f.dataType.json))))) ~
      ("value_type" -> JsonMethods.parse(valueType.json)) ~
      ("map_key_type" -> mapKeyType.map(t => JsonMethods.parse(t.json))) ~
      ("pickled" -> (("value" -> pickled.value) ~ ("map_key" -> pickled.mapKey)))
}

/**
 * The queryable states of a running query, read off the plan of its last batch: the keyed
 * functions' states made queryable, and the stores of Spark's operators named by
 * `keyedstate.queryable` (typed as the state reader types them: Spark's schema files).
 */
object QueryableStates {
  private val logger = org.slf4j.LoggerFactory.getLogger(getClass)

  /** The states, and whether they are complete (every operator named by a setting was found in the plan and typed). */
  def of(query: StreamExecution): (Seq[QueryableState], Boolean) = Option(query.lastExecution) match {
    case None => (Nil, false)
    case Some(execution) =>
      val (operators, complete) = sparkOperatorStates(query, execution)
      (keyedFunctionStates(execution) ++ operators, complete)
  }

  private def keyedFunctionStates(execution: IncrementalExecution): Seq[QueryableState] =
    execution.executedPlan.collect { case apply: KeyedStateApplyExec => apply }.flatMap { apply =>
      val spec = ProcessSpec.fromJson(apply.specJson)
      val info = apply.stateInfo.getOrElse(throw new IllegalStateException(s"$apply has no state info"))
      val layout = new StateLayout(spec, apply.inputSchema)
      spec.queryableStates.map { case (name, v) =>
        val answer = v.kind match {
          case StateKind.List => Answer.Elements
          case StateKind.Map => Answer.Entries
          case _ => Answer.Value
        }
        new QueryableState(name, v.declaredKind, spec.uid.getOrElse(spec.functionName), info.operatorId,
          info.numPartitions, info.checkpointLocation, StateStoreId.DEFAULT_STORE_NAME, answer, layout.keySchema,
          layout.keySchema.indices, layout.family(v), v.valueType, v.mapKeyType, v.pickled)
      }
    }

  /** The stores of Spark's operators named in the query's `queryable.operator.<id>` settings. */
  private def sparkOperatorStates(query: StreamExecution, execution: IncrementalExecution)
      : (Seq[QueryableState], Boolean) = {
    val named = KeyedStateConf(StateStoreConf(execution.sparkSession.sessionState.conf)).queryableOperators
    if (named.isEmpty) (Nil, true)
    else {
      val writers = execution.executedPlan.collect { case w: StateStoreWriter => w }
        .flatMap(w => w.stateInfo.map(w -> _)).filter { case (_, info) => named.contains(info.operatorId) }
      if (writers.isEmpty) (Nil, false)
      else {
        val ckpt = new QueryCheckpoint(new Path(query.resolvedCheckpointRoot), execution.sparkSession.sessionState.newHadoopConf())
        val tables = StateTables(ckpt, ckpt.lastBatch("commits").getOrElse(0L))
        // Per operator: its state, None when it cannot be queryable, unknown (no schema yet) left out.
        val found: Seq[Option[QueryableState]] = writers.flatMap { case (writer, info) =>
          val name = named(info.operatorId)
          try {
            val (_, found) = tables.operatorOf(info.operatorId.toString)
            found.filter(_.storeName == StateStoreId.DEFAULT_STORE_NAME) match {
              case Seq(t) if t.family.spec.isInstanceOf[NoPrefixKeyStateEncoderSpec] =>
                val keySchema = t.family.keySchema
                Seq(Some(new QueryableState(name, "store", s"${writer.nodeName}", info.operatorId,
                  info.numPartitions, info.checkpointLocation, t.storeName, Answer.Row, keySchema,
                  KeyGroups.partitionKeyOrdinals(t.storeName, keySchema, t.family.spec), t.family, t.family.valueSchema,
                  None, PickledParts.None)))
              case other =>
                logger.warn(s"keyedstate: operator ${info.operatorId} (${writer.nodeName}) cannot be queryable as " +
                  s"'$name': only operators with one store keyed by whole keys are (found ${other.map(_.describe)})")
                Seq(None)
            }
          } catch {
            case NonFatal(e) =>
              logger.info(s"keyedstate: the state of operator ${info.operatorId} is not known yet: ${e.getMessage}")
              Nil
          }
        }
        (found.flatten, found.size == writers.size)
      }
    }
  }
}
