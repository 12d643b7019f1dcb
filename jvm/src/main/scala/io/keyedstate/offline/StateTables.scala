package io.keyedstate.offline

import java.util.UUID

import scala.util.control.NonFatal

import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types._
import org.json4s.jackson.JsonMethods

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

import io.keyedstate.engine._

/**
 * One table of a checkpoint's state, as `keyedstate.state.read` returns it and a canonical
 * savepoint stores it: a keyed function's state (or its event-time or processing-time timers),
 * or one state store of Spark's own stateful operator (an aggregation, a deduplication,
 * `(flat)mapGroupsWithState`, one of a stream-stream join's four stores).
 *
 * `family` is the column family the rows are stored in; `storeKeySchema`/`storeValueSchema` and
 * `storeSpec` are what the provider is opened with (a keyed function's store has no default
 * column family of its own: Spark's API needs a schema for it all the same). A keyed function's
 * state with a TTL has `lastAccess`: its rows carry each value's last-access timestamp.
 */
final case class StateTable(
    operatorId: Int,
    operatorName: String,
    function: String,
    uid: String,
    state: String,
    kind: String,
    storeName: String,
    family: Family,
    storeKeySchema: StructType,
    storeValueSchema: StructType,
    storeSpec: KeyStateEncoderSpec,
    columnFamilies: Boolean,
    ttlOptions: Map[String, String],
    lastAccess: Boolean = false) {

  def isKeyedFunction: Boolean = function.nonEmpty

  /** How errors name the table: `state 'total' of keyed function Counter (uid 'c'), operator 1000`. */
  def describe: String =
    if (isKeyedFunction) {
      s"$kind '$state' of keyed function $function${if (uid.isEmpty) "" else s" (uid '$uid')"}, operator $operatorId"
    } else s"store '$storeName' of operator $operatorId ($operatorName)"
}

object StateTable {
  /** The kind of a table of Spark's own operators: a key row and a value row per entry. */
  val SparkStore = "store"
  val Timers = "timers"

  /** Whether a table of `kind` holds a keyed function's operator state (a list per partition). */
  def isOperatorState(kind: String): Boolean = kind != SparkStore && kind != Timers && StateKind.parse(kind).isOperatorState

  /** Whether a table of `kind` holds a keyed function's broadcast state (alike in every partition). */
  def isBroadcast(kind: String): Boolean = kind == StateKind.Broadcast.name
}

/**
 * The tables of a checkpoint at one committed batch, and which one a read asks for. A keyed
 * function's tables come from its declaration (`declared`), Spark's operators' from the schema
 * files Spark wrote for each of their stores (`storesOf`), or from a canonical savepoint's
 * metadata (`recorded`).
 */
final class StateTables private (
    ckpt: QueryCheckpoint,
    operatorIds: Seq[Int],
    declared: Int => Option[OperatorDeclaration],
    storesOf: Int => Seq[String],
    recorded: Int => Option[Seq[StateTable]] = _ => None) {
  import StateTable._

  /** Every stateful operator of the checkpoint, with its tables. */
  lazy val operators: Seq[(Int, Seq[StateTable])] = operatorIds.map(op => op -> tablesOf(op))

  private def tablesOf(op: Int): Seq[StateTable] = declarationOf(op) match {
    case Some(d) => keyedFunctionTables(op, d)
    case None => recorded(op).getOrElse(sparkOperatorTables(op))
  }

  /** A keyed function's declaration; None for Spark's own operators. */
  def declarationOf(op: Int): Option[OperatorDeclaration] = declarations.getOrElseUpdate(op, declared(op))
  private val declarations = scala.collection.mutable.Map.empty[Int, Option[OperatorDeclaration]]

  private def keyedFunctionTables(op: Int, d: OperatorDeclaration): Seq[StateTable] = {
    val states = d.states.map(_.toVar)
    val layout = new StateLayout(ProcessSpec("", d.uid, d.function, d.keySchema.fieldNames.toSeq, None, states,
      timers = true, StructType(Nil)), d.keySchema)
    val ttl = StoreOptions.ttlOptions(states, op)
    def table(name: String, kind: String, family: Family, lastAccess: Boolean = false) =
      StateTable(op, ckpt.operatorName(op), d.function, d.uid.getOrElse(""), name, kind,
        StateStoreId.DEFAULT_STORE_NAME, family, layout.keySchema, layout.defaultValueSchema,
        NoPrefixKeyStateEncoderSpec(layout.keySchema), columnFamilies = true, ttl, lastAccess)
    d.states.zip(states).map { case (declared, v) =>
      table(v.name, declared.kind, layout.family(v), lastAccess = v.ttl.isDefined && !v.kind.isOperatorState)
    } ++
      (if (d.timers) Seq(table(StateLayout.EventTimers, Timers, layout.eventTimers),
        table(StateLayout.ProcTimers, Timers, layout.procTimers)) else Nil)
  }

  /** Spark's operator: one table per store, typed by the schema file Spark wrote for it. */
  private def sparkOperatorTables(op: Int): Seq[StateTable] = {
    val name = ckpt.operatorName(op)
    storesOf(op).flatMap { store =>
      val checker = new StateSchemaCompatibilityChecker(
        StateStoreProviderId(StateStoreId(ckpt.stateRoot.toString, op, 0, store), UUID.randomUUID()), ckpt.hadoopConf)
      val schemas = try checker.readSchemaFile() catch { case NonFatal(_) => Nil }
      schemas.filter(_.colFamilyName == StateStore.DEFAULT_COL_FAMILY_NAME).map { s =>
        StateTables.sparkStore(op, name, store, s.keySchema, s.valueSchema,
          s.keyStateEncoderSpec.getOrElse(defaultSpec(name, s.keySchema)))
      }
    }
  }

  /** The key encoding of a schema file that does not record it (format v2): a session window's
   *  store is scanned by its grouping key, the prefix of (key, session start). */
  private def defaultSpec(operatorName: String, keySchema: StructType): KeyStateEncoderSpec =
    if (operatorName.toLowerCase.contains("session") && keySchema.length > 1) {
      PrefixKeyScanStateEncoderSpec(keySchema, keySchema.length - 1)
    } else NoPrefixKeyStateEncoderSpec(keySchema)

  /**
   * The table a read asks for: `operator` is a keyed function's uid, an operator id, or empty
   * (the checkpoint's only stateful operator); `state` a state or timers of a keyed function, a
   * store of Spark's operator, or empty (the operator's only table).
   */
  def find(operator: String, state: String): StateTable = {
    val (op, tables) = operatorOf(operator)
    val readable = tables.filterNot(t => t.kind == Timers && state.isEmpty)
    state match {
      case "" => readable match {
        case Seq(only) => only
        case _ => throw invalid(s"${describeOperator(op, tables)} has several states; name one")
      }
      case name => tables.find(_.state == name).getOrElse(throw invalid(
        s"${describeOperator(op, tables)} has no state '$name'"))
    }
  }

  /** The operator `operator` names (a uid, an id, or empty: the only one), with its tables. */
  def operatorOf(operator: String): (Int, Seq[StateTable]) = {
    def listed = operators.map { case (op, ts) => describeOperator(op, ts) }.mkString("; ")
    operator.trim match {
      case "" => operators match {
        case Seq(only) => only
        case Seq() => throw invalid(s"${ckpt.root} has no stateful operator")
        case _ => throw invalid(s"${ckpt.root} has several stateful operators ($listed); name one by uid or operator id")
      }
      case id if id.forall(_.isDigit) => operators.find(_._1 == id.toInt).getOrElse(
        throw invalid(s"${ckpt.root} has no stateful operator $id; its operators: $listed"))
      case uid => operators.find(_._2.exists(_.uid == uid)).getOrElse(
        throw invalid(s"${ckpt.root} has no keyed function with uid '$uid'; its operators: $listed"))
    }
  }

  private def describeOperator(op: Int, tables: Seq[StateTable]): String = tables.headOption match {
    case Some(t) if t.isKeyedFunction =>
      s"operator $op: keyed function ${t.function}${if (t.uid.isEmpty) "" else s" (uid '${t.uid}')"}, states " +
        tables.map(x => s"'${x.state}'").mkString(", ")
    case Some(t) => s"operator $op: ${t.operatorName}, stores ${tables.map(x => s"'${x.state}'").mkString(", ")}"
    case None => s"operator $op: ${ckpt.operatorName(op)} (no state schema)"
  }

  private def invalid(message: String) = KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, message)
}

object StateTables {
  /** The tables of a checkpoint (or a native savepoint) at committed batch `batch`. */
  def apply(ckpt: QueryCheckpoint, batch: Long): StateTables =
    new StateTables(ckpt, ckpt.operators, declaredAt(ckpt, batch), op => {
      // Spark's metadata names the stores whatever the provider; keyedstate's store directories
      // are the fallback (other providers keep directories of their own in a partition's).
      val listed = ckpt.operatorStoreNames(op)
      lazy val found = ckpt.storeNames(op, 0)
      if (listed.nonEmpty) listed else if (found.nonEmpty) found else Seq(StateStoreId.DEFAULT_STORE_NAME)
    })

  /**
   * The tables of a savepoint: a native one's as a checkpoint's at its batch, a canonical one's
   * (its operators, declarations and schemas) as its metadata records them.
   */
  def apply(root: QueryCheckpoint, metadata: SavepointMetadata): StateTables =
    if (metadata.format == SavepointMetadata.Canonical) canonical(root, metadata) else apply(root, metadata.batchId)

  private def canonical(root: QueryCheckpoint, metadata: SavepointMetadata): StateTables = {
    val byId = metadata.operators.map(o => o.operatorId -> o).toMap
    val source = SavepointMetadata.path(root.root).toString
    def declared(op: Int) = byId(op).declaration.map { json =>
      OperatorDeclaration.fromJson(JsonMethods.parse(json), source).getOrElse(throw KeyedStateErrors.fileCorrupt(
        s"$source: the declaration of operator $op is not a keyed function's"))
    }
    def recorded(op: Int): Option[Seq[StateTable]] = {
      val o = byId(op)
      if (o.declaration.isDefined) None
      else Some(o.tables.map { t =>
        val schemas = for (k <- t.keySchema; v <- t.valueSchema; spec <- t.keySpec) yield (k, v, spec)
        val (k, v, spec) = schemas.getOrElse(throw KeyedStateErrors.fileCorrupt(
          s"$source records no key and value schema for store '${t.storeName}' of operator $op"))
        val keySchema = DataType.fromJson(k).asInstanceOf[StructType]
        sparkStore(op, o.name, t.storeName, keySchema, DataType.fromJson(v).asInstanceOf[StructType],
          KeyStateEncoderSpec.fromJson(keySchema, JsonMethods.parse(spec).values.asInstanceOf[Map[String, Any]]))
      })
    }
    new StateTables(root, metadata.operators.map(_.operatorId), declared, op => byId(op).tables.map(_.storeName).distinct,
      recorded)
  }

  /** A store of Spark's own operator as a table: its key and value rows as the store keeps them. */
  def sparkStore(op: Int, operatorName: String, store: String, keySchema: StructType, valueSchema: StructType,
      spec: KeyStateEncoderSpec): StateTable =
    StateTable(op, operatorName, "", "", store, StateTable.SparkStore, store,
      Family(StateStore.DEFAULT_COL_FAMILY_NAME, keySchema, valueSchema, spec, multipleValues = false),
      keySchema, valueSchema, spec, columnFamilies = false, Map.empty)

  /**
   * A keyed function's declaration, from partition 0's manifest of the version `batch`
   * committed; None for Spark's own operators (below the keyed functions' first id).
   */
  private def declaredAt(ckpt: QueryCheckpoint, batch: Long)(op: Int): Option[OperatorDeclaration] =
    if (op < KeyedProcessOperators.FirstOperatorId) None
    else {
      val id = ckpt.defaultStoreCheckpointIds(batch, op, Seq(0)).get(0)
      val dir = ckpt.storeDir(StoreRef(op, StateStoreId.DEFAULT_STORE_NAME, 0))
      Some(OperatorDeclaration.read(dir, batch + 1, id, ckpt.hadoopConf, op))
    }
}
