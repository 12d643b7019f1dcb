package io.keyedstate.queryable

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.apache.spark.sql.types._
import org.json4s._
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.StorePartition
import io.keyedstate.engine.{Family, KeyedStateApplyExec, ProcessSpec, StateKind, StateLayout, StateVar}
import io.keyedstate.rocks.{ColumnFamilyCodec, KeyGroupHasher, KeyGroups}

/**
 * One queryable state of a running query (Flink's `setQueryable` name): where it lives (operator,
 * partition count, checkpoint) and how its keys and values are stored. Its codec is used by one
 * thread at a time ([[withCodec]]): Spark's encoders reuse their rows.
 */
final class QueryableState(
    val name: String,
    val functionName: String,
    val operatorId: Long,
    val numPartitions: Int,
    val checkpointRoot: String,
    val state: StateVar,
    val keySchema: StructType,
    family: Family) {

  val kind: StateKind = state.kind

  def partition(p: Int): StorePartition = StorePartition(checkpointRoot, operatorId, p, StateStoreId.DEFAULT_STORE_NAME)

  /** The stored value type: the value, the list's element or the map's value. */
  def valueType: DataType = state.valueType

  private val codec = new ColumnFamilyCodec(StateStoreId.DEFAULT_STORE_NAME, family.name, family.keySchema,
    family.valueSchema, family.spec, family.multipleValues, isInternal = false)
  private val toUnsafe = UnsafeProjection.create(keySchema)
  private val hasher = new KeyGroupHasher(keySchema, keySchema.indices)
  // A map's entries: the key columns, then the map key.
  private lazy val mapKeyOrdinal = keySchema.length

  def column: String = family.name

  def withCodec[T](f: Codec => T): T = synchronized(f(new Codec))

  /** The codec's calls, valid inside [[withCodec]]. */
  final class Codec private[QueryableState] {
    /** The partition owning `key` (the key columns' row) and its stored key (a map's: its entries' prefix). */
    def locate(key: InternalRow): (Int, Array[Byte]) = {
      val row = toUnsafe(key)
      val owner = KeyGroups.owner(hasher.tag(row), numPartitions)
      (owner, if (kind == StateKind.Map) codec.encodePrefix(row) else codec.encodeKey(row))
    }

    /** A stored value as JSON: the value, or the list of elements. */
    def valueJson(bytes: Array[Byte]): JValue =
      if (bytes == null) JNull
      else if (family.multipleValues) JArray(codec.decodeValues(bytes).toList.map(JsonValues.toJson(_, 0, valueType)))
      else JsonValues.toJson(codec.decodeValue(bytes), 0, valueType)

    /** A map entry as `[map key, value]`. */
    def entryJson(key: Array[Byte], value: Array[Byte]): JValue =
      JArray(List(JsonValues.toJson(codec.decodeKey(key), mapKeyOrdinal, state.mapKeyType.get),
        JsonValues.toJson(codec.decodeValue(value), 0, valueType)))
  }

  def toJson: JValue =
    ("name" -> name) ~ ("kind" -> state.declaredKind) ~ ("function" -> functionName) ~ ("operator" -> operatorId) ~
      ("partitions" -> numPartitions) ~
      ("key_columns" -> JArray(keySchema.fields.toList.map(f =>
        ("name" -> f.name) ~ ("type" -> JsonMethods.parse(f.dataType.json))))) ~
      ("value_type" -> JsonMethods.parse(valueType.json)) ~
      ("map_key_type" -> state.mapKeyType.map(t => JsonMethods.parse(t.json))) ~
      ("pickled" -> (("value" -> state.pickled.value) ~ ("map_key" -> state.pickled.mapKey)))
}

/** The queryable states of a running query, read off the plan of its last batch. */
object QueryableStates {
  def of(query: StreamExecution): Seq[QueryableState] = Option(query.lastExecution).toSeq.flatMap { execution =>
    execution.executedPlan.collect { case apply: KeyedStateApplyExec => apply }.flatMap { apply =>
      val spec = ProcessSpec.fromJson(apply.specJson)
      val info = apply.stateInfo.getOrElse(throw new IllegalStateException(s"$apply has no state info"))
      val layout = new StateLayout(spec, apply.inputSchema)
      spec.queryableStates.map { case (name, v) =>
        new QueryableState(name, spec.uid.getOrElse(spec.functionName), info.operatorId, info.numPartitions,
          info.checkpointLocation, v, layout.keySchema, layout.family(v))
      }
    }
  }
}
