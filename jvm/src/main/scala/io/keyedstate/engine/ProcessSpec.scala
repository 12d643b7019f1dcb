package io.keyedstate.engine

import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types._
import org.json4s._
import org.json4s.jackson.JsonMethods

import io.keyedstate.rocks.KeyGroups

/**
 * The kind of a declared state variable (Flink's state kinds). Operator state is a list per
 * partition, redistributed when a query restores: an even split (`get_list_state`) or the union
 * (`get_union_list_state`), see `offline.OperatorStateRedistribution`.
 */
sealed abstract class StateKind(val name: String) {
  def isOperatorState: Boolean = this == StateKind.OperatorList || this == StateKind.OperatorUnionList
  /** Kept per partition, not per key: operator state and broadcast state. */
  def isPartitionLevel: Boolean = isOperatorState || this == StateKind.Broadcast
}
object StateKind {
  case object Value extends StateKind("value")
  case object List extends StateKind("list")
  case object Map extends StateKind("map")
  case object OperatorList extends StateKind("operator_list")
  case object OperatorUnionList extends StateKind("operator_union_list")
  /** A map every partition keeps alike, written by the broadcast stream's elements. */
  case object Broadcast extends StateKind("broadcast")
  // Reducing and aggregating state store one value per key, like value state.
  private val byName = Seq(Value, List, Map, OperatorList, OperatorUnionList, Broadcast).map(k => k.name -> k).toMap ++
    Seq("reducing" -> Value, "aggregating" -> Value)

  /** The kinds Python declares states with (`keyedstate.state.descriptors`; a test checks both agree). */
  val names: Seq[String] = byName.keys.toSeq.sorted

  def parse(raw: String): StateKind = byName.getOrElse(raw, throw new IllegalArgumentException(
    s"unknown state kind '$raw'; allowed: ${names.mkString(", ")}"))
}

/**
 * Which parts of a state's values Python stores as pickles (`Types.PICKLED_BYTE_ARRAY()`, a
 * binary column to the JVM): a lookup's client unpickles them.
 */
final case class PickledParts(value: Boolean, mapKey: Boolean)
object PickledParts {
  val None: PickledParts = PickledParts(value = false, mapKey = false)
}

/** Provider-side TTL of one state variable, in the provider's own option names (docs/ttl.md). */
final case class StateTtl(options: Map[String, String])

/**
 * One declared state variable: `valueType` is the value (value, reducing, aggregating), the
 * element (list) or the map value; `mapKeyType` the map key. `queryableName` is the name lookups
 * read it by (`set_queryable`, Flink's `setQueryable`), if any.
 */
final case class StateVar(
    name: String,
    kind: StateKind,
    declaredKind: String,
    valueType: DataType,
    mapKeyType: Option[DataType],
    ttl: Option[StateTtl],
    queryableName: Option[String] = None,
    pickled: PickledParts = PickledParts.None) {

  /** The column family holding it. User names cannot start with `$` (reserved for internals). */
  def columnFamily: String =
    if (kind.isOperatorState) KeyGroups.PartitionLocalPrefix + name
    else if (kind == StateKind.Broadcast) KeyGroups.BroadcastPrefix + name
    else name
}

/**
 * What the Python side declares about one keyed function (`keyedstate.key_by(...).process(...)`):
 * parsed from the JSON the planner sends, and the source of every schema both sides exchange.
 * `nodeId` tells the function's plan nodes apart within a plan; `uid` is the name the user gave
 * the operator (`process(..., uid=...)`, Flink's `uid`), kept in its state's declaration.
 */
final case class ProcessSpec(
    nodeId: String,
    uid: Option[String],
    functionName: String,
    keyColumns: Seq[String],
    orderBy: Option[String],
    states: Seq[StateVar],
    timers: Boolean,
    outputSchema: StructType,
    broadcastSchema: Option[StructType] = None,
    visitsKeyedState: Boolean = false) {

  require(keyColumns.nonEmpty, "a keyed function needs at least one key column")
  val keyedStates: Seq[(StateVar, Int)] = states.zipWithIndex.filterNot(_._1.kind.isPartitionLevel)
  val operatorStates: Seq[(StateVar, Int)] = states.zipWithIndex.filter(_._1.kind.isOperatorState)
  val unionStates: Seq[(StateVar, Int)] = states.zipWithIndex.filter(_._1.kind == StateKind.OperatorUnionList)
  val broadcastStates: Seq[(StateVar, Int)] = states.zipWithIndex.filter(_._1.kind == StateKind.Broadcast)
  /** What the partition's operator-state row carries: operator lists and broadcast maps. */
  val partitionStates: Seq[(StateVar, Int)] = states.zipWithIndex.filter(_._1.kind.isPartitionLevel)
  /** The states lookups read (queryable state), by the name they are read by. */
  val queryableStates: Seq[(String, StateVar)] = states.flatMap(v => v.queryableName.map(_ -> v))
}

object ProcessSpec {
  private implicit val formats: Formats = DefaultFormats

  def fromJson(json: String): ProcessSpec = {
    val root = JsonMethods.parse(json)
    def dataType(v: JValue): DataType = DataType.fromJson(JsonMethods.compact(v))
    val states = (root \ "states").extract[List[JValue]].map { s =>
      val kindName = (s \ "kind").extract[String]
      val ttl = (s \ "ttl") match {
        case JNothing | JNull => None
        case obj: JObject => Some(StateTtl(obj.obj.map { case (k, v) => k -> v.extract[String] }.toMap))
        case other => throw new IllegalArgumentException(s"bad ttl ${JsonMethods.compact(other)}")
      }
      StateVar(
        (s \ "name").extract[String],
        StateKind.parse(kindName),
        kindName,
        dataType(s \ "type"),
        (s \ "keyType") match { case JNothing | JNull => None; case v => Some(dataType(v)) },
        ttl,
        (s \ "queryable").extractOpt[String],
        PickledParts((s \ "pickled" \ "value").extractOpt[Boolean].getOrElse(false),
          (s \ "pickled" \ "mapKey").extractOpt[Boolean].getOrElse(false)))
    }
    ProcessSpec(
      (root \ "nodeId").extract[String],
      (root \ "uid").extractOpt[String],
      (root \ "function").extract[String],
      (root \ "keyColumns").extract[List[String]],
      (root \ "orderBy").extractOpt[String],
      states,
      (root \ "timers").extract[Boolean],
      dataType(root \ "outputSchema").asInstanceOf[StructType],
      (root \ "broadcastSchema") match {
        case JNothing | JNull => None
        case v => Some(dataType(v).asInstanceOf[StructType])
      },
      (root \ "visitsKeyedState").extractOpt[Boolean].getOrElse(false))
  }
}

/**
 * Rows between the JVM and Python. In (lookup → Python): one schema whose first columns say what
 * a row is; out (Python → apply): outputs and state mutations. Every column is nullable: a row
 * fills only the columns of its kind. Documented in docs/python-api.md ("Engine").
 */
object Exchange {
  // Kinds of rows going to Python.
  val Batch: Byte = 0      // first row of a partition: __ks_time = processing time, __ks_wm = watermark
  val Key: Byte = 1        // a key: key columns at their input positions, every keyed state's value
  val EventTimer: Byte = 2 // a due event-time timer of the current key (__ks_time)
  val ProcTimer: Byte = 3  // a due processing-time timer of the current key
  val Element: Byte = 4    // an input row of the current key
  val OperatorState: Byte = 5 // the partition's operator list states and broadcast states
  val BroadcastElement: Byte = 6 // an element of the broadcast stream, in its own columns (__ks_b<i>)
  val VisitedKey: Byte = 7 // a stored key with all its state, ahead of the broadcast elements (apply_to_keyed_state)

  // Kinds of rows coming back.
  val Output: Byte = 0
  val KeyChanges: Byte = 1     // one row per key whose state changed: its key, per state variable an op and data
  val OperatorStates: Byte = 2 // the partition's operator list states and broadcast states (no key)
  val RegisterEventTimer: Byte = 5
  val RegisterProcTimer: Byte = 6
  val DeleteEventTimer: Byte = 7
  val DeleteProcTimer: Byte = 8

  // What a change row does to one state variable (its __ks_op<i>; null: unchanged).
  val Put: Byte = 1    // value: set; list: replace (empty: remove); map: remove __ks_rm<i>, put __ks_s<i>; operator list: replace
  val Append: Byte = 2 // list: append __ks_s<i>
  val Clear: Byte = 3  // value, list: remove; map: remove every entry, then put __ks_s<i>

  val KindColumn = "__ks_kind"
  val TimeColumn = "__ks_time"
  val WatermarkColumn = "__ks_wm"
  val PartitionsColumn = "__ks_parts"
  def stateColumn(i: Int): String = s"__ks_s$i"
  def opColumn(i: Int): String = s"__ks_op$i"
  def removedColumn(i: Int): String = s"__ks_rm$i"
  def keyColumn(i: Int): String = s"__ks_k$i"
  def broadcastColumn(i: Int): String = s"__ks_b$i"

  private def nullable(s: StructType): Seq[StructField] = s.fields.toSeq.map(_.copy(nullable = true))

  /**
   * What Python reads: header columns, the input's columns, the broadcast stream's (renamed
   * `__ks_b<i>`), then one column per state variable.
   */
  def inSchema(spec: ProcessSpec, input: StructType): StructType = {
    val states = spec.states.zipWithIndex.map { case (v, i) =>
      val t = v.kind match {
        case StateKind.Value => v.valueType
        case StateKind.List | StateKind.OperatorList | StateKind.OperatorUnionList => ArrayType(v.valueType, containsNull = false)
        case StateKind.Map | StateKind.Broadcast => MapType(v.mapKeyType.get, v.valueType, valueContainsNull = true)
      }
      StructField(stateColumn(i), t, nullable = true)
    }
    val broadcast = spec.broadcastSchema.toSeq.flatMap(b => nullable(b).zipWithIndex.map { case (f, i) =>
      f.copy(name = broadcastColumn(i))
    })
    StructType(Seq(
      StructField(KindColumn, ByteType, nullable = false),
      StructField(TimeColumn, LongType),
      StructField(WatermarkColumn, LongType),
      StructField(PartitionsColumn, IntegerType)) ++ nullable(input) ++ broadcast ++ states)
  }

  /**
   * What Python writes: kind, the output's columns, the key, the timer's time, then per state
   * variable its op and its data: the value, the list (whole or appended), the map entries to
   * put and (maps) the map keys to remove.
   */
  def outSchema(spec: ProcessSpec, input: StructType): StructType = {
    val keys = spec.keyColumns.zipWithIndex.map { case (c, i) => StructField(keyColumn(i), input(c).dataType) }
    val states = spec.states.zipWithIndex.flatMap { case (v, i) =>
      val data = v.kind match {
        case StateKind.Value => Seq(StructField(stateColumn(i), v.valueType))
        case StateKind.List | StateKind.OperatorList | StateKind.OperatorUnionList =>
          Seq(StructField(stateColumn(i), ArrayType(v.valueType, containsNull = false)))
        case StateKind.Map | StateKind.Broadcast => Seq(
          StructField(stateColumn(i), MapType(v.mapKeyType.get, v.valueType, valueContainsNull = true)),
          StructField(removedColumn(i), ArrayType(v.mapKeyType.get, containsNull = false)))
      }
      StructField(opColumn(i), ByteType) +: data
    }
    StructType(Seq(StructField(KindColumn, ByteType, nullable = false)) ++ nullable(spec.outputSchema) ++
      keys ++ Seq(StructField(TimeColumn, LongType)) ++ states)
  }
}

/** One column family of a keyed function's store. */
final case class Family(name: String, keySchema: StructType, valueSchema: StructType,
    spec: KeyStateEncoderSpec, multipleValues: Boolean)

/** How each state variable and the timers are laid out in the state store's column families. */
final class StateLayout(spec: ProcessSpec, input: StructType) extends Serializable {
  val keySchema: StructType = StructType(spec.keyColumns.map(c => input(c).copy(nullable = true)))
  val numKeyColumns: Int = keySchema.length

  private def valueStruct(t: DataType) = StructType(Seq(StructField("value", t, nullable = true)))

  def family(v: StateVar): Family = v.kind match {
    case StateKind.Value => Family(v.columnFamily, keySchema, valueStruct(v.valueType),
      NoPrefixKeyStateEncoderSpec(keySchema), multipleValues = false)
    case StateKind.List => Family(v.columnFamily, keySchema, valueStruct(v.valueType),
      NoPrefixKeyStateEncoderSpec(keySchema), multipleValues = true)
    case StateKind.Map =>
      val schema = StructType(keySchema.fields :+ StructField("user_map_key", v.mapKeyType.get, nullable = true))
      Family(v.columnFamily, schema, valueStruct(v.valueType),
        PrefixKeyScanStateEncoderSpec(schema, numKeyColumns), multipleValues = false)
    case StateKind.OperatorList | StateKind.OperatorUnionList => OperatorLists.family(v)
    case StateKind.Broadcast =>
      val schema = StructType(Seq(StructField("user_map_key", v.mapKeyType.get, nullable = true)))
      Family(v.columnFamily, schema, valueStruct(v.valueType), NoPrefixKeyStateEncoderSpec(schema),
        multipleValues = false)
  }

  /** Timers ordered by time: the key is (timestamp, key columns), range-scanned by timestamp. */
  val timerKeySchema: StructType =
    StructType(StructField("timestamp", LongType, nullable = false) +: keySchema.fields)
  private val timerValueSchema = StructType(Seq(StructField("unused", BooleanType, nullable = true)))
  val eventTimers: Family = Family(StateLayout.EventTimers, timerKeySchema, timerValueSchema,
    RangeKeyScanStateEncoderSpec(timerKeySchema, Seq(0)), multipleValues = false)
  val procTimers: Family = Family(StateLayout.ProcTimers, timerKeySchema, timerValueSchema,
    RangeKeyScanStateEncoderSpec(timerKeySchema, Seq(0)), multipleValues = false)

  val families: Seq[Family] =
    spec.states.map(family) ++ (if (spec.timers) Seq(eventTimers, procTimers) else Nil)

  /** The default column family is not used; Spark's API needs a schema for it. */
  val defaultValueSchema: StructType = valueStruct(BooleanType)
}

object StateLayout {
  val EventTimers = "$eventTimers"
  val ProcTimers = "$procTimers"
}
