package io.keyedstate.engine

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.apache.spark.sql.types._
import org.json4s._
import org.json4s.jackson.JsonMethods

import io.keyedstate.TaskStateStore
import io.keyedstate.checkpoint.CheckpointStore
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.shims.SparkTypes.StatefulOperatorStateInfo

/** One state as a keyed function declared it: kind as declared (`reducing`, ...), types, TTL options. */
final case class DeclaredState(name: String, kind: String, valueType: DataType, mapKeyType: Option[DataType],
    ttl: Map[String, String]) {
  def toVar: StateVar =
    StateVar(name, StateKind.parse(kind), kind, valueType, mapKeyType, if (ttl.isEmpty) None else Some(StateTtl(ttl)))

  def describe: String =
    mapKeyType.fold(s"$kind state of ${valueType.simpleString}")(k => s"$kind state of ${k.simpleString} -> ${valueType.simpleString}")
}

/**
 * A keyed function's declared layout: its uid (when the user named it), function, key columns
 * with their types, whether it has timers, and every state's kind and types. Kept in every
 * committed version's manifest (`VersionManifest.declaration`), so the state and its declaration
 * are written, checksummed, retained, rescaled and lost together; states no longer declared stay
 * declared (and stored) until the checkpoint goes.
 */
final case class OperatorDeclaration(
    uid: Option[String],
    function: String,
    keySchema: StructType,
    timers: Boolean,
    states: Seq[DeclaredState]) {

  /** How errors and tools name the function: `Counter (uid 'counter')`. */
  def describe: String = function + uid.fold("")(u => s" (uid '$u')")

  def toJson: JValue = JObject(
    List("kind" -> JString(OperatorDeclaration.Kind)) ++
      uid.map(u => "uid" -> JString(u)).toList ++
      List(
        "function" -> JString(function),
        "keySchema" -> JsonMethods.parse(keySchema.json),
        "timers" -> JBool(timers),
        "states" -> JArray(states.toList.map { s =>
          JObject(List("name" -> JString(s.name), "kind" -> JString(s.kind), "type" -> JsonMethods.parse(s.valueType.json)) ++
            s.mapKeyType.map(k => "keyType" -> JsonMethods.parse(k.json)).toList ++
            (if (s.ttl.isEmpty) Nil else List("ttl" -> JObject(s.ttl.toList.sorted.map { case (o, v) => o -> JString(v) }))))
        })))
}

object OperatorDeclaration {
  private implicit val formats: Formats = DefaultFormats

  /** The `kind` of a keyed function's declaration (other operators may declare other kinds). */
  val Kind = "keyedFunction"

  def of(spec: ProcessSpec, input: StructType): OperatorDeclaration =
    OperatorDeclaration(spec.uid, spec.functionName, new StateLayout(spec, input).keySchema, spec.timers,
      spec.states.map(v => DeclaredState(v.name, v.declaredKind, v.valueType, v.mapKeyType,
        v.ttl.map(_.options).getOrElse(Map.empty))))

  /** A declaration read from `source` (a manifest), which a parse failure names as corrupt. */
  def fromJson(root: JValue, source: => String): Option[OperatorDeclaration] =
    if ((root \ "kind") != JString(Kind)) None
    else try {
      def dt(v: JValue) = DataType.fromJson(JsonMethods.compact(v))
      Some(OperatorDeclaration(
        (root \ "uid").extractOpt[String],
        (root \ "function").extract[String],
        dt(root \ "keySchema").asInstanceOf[StructType],
        (root \ "timers").extract[Boolean],
        (root \ "states").extract[List[JValue]].map { s =>
          DeclaredState((s \ "name").extract[String], (s \ "kind").extract[String], dt(s \ "type"),
            (s \ "keyType") match { case JNothing | JNull => None; case v => Some(dt(v)) },
            (s \ "ttl") match { case o: JObject => o.obj.map { case (k, v) => k -> v.extract[String] }.toMap; case _ => Map.empty })
        }))
    } catch {
      case NonFatal(e) => throw KeyedStateErrors.fileCorrupt(
        s"$source holds a keyed function declaration that cannot be read: ${e.getMessage}", e)
    }

  private def keyDescription(s: StructType): String = s.fields.map(f => s"${f.name} ${f.dataType.simpleString}").mkString(", ")

  /**
   * The declaration to commit for `declared` on a version that was committed with `stored`: the
   * same operator (the same uid, or without one the same function), key columns and each state's
   * kind and type, or a clear error naming both; states no longer declared are kept.
   */
  def reconcile(stored: OperatorDeclaration, declared: OperatorDeclaration, operatorId: Long,
      partition: Option[Int]): OperatorDeclaration = {
    val operator = operatorName(operatorId, declared, partition)
    val sameOperator = stored.uid match {
      case Some(u) => declared.uid.contains(u)
      case None => declared.function == stored.function
    }
    if (!sameOperator) {
      throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionUidChanged,
        s"$operator holds the state of keyed function ${stored.describe}, and the query now runs " +
          s"${declared.describe} there: operator ids follow the order in which the query applies its keyed " +
          "functions, so functions were reordered, added or removed, or the uid changed. Keep the keyed functions " +
          "in their order with their uids (to rename a function's class, give it a uid in one run first), or start " +
          "a new checkpoint")
    }
    val oldKey = stored.keySchema.fields.map(f => (f.name, f.dataType))
    val newKey = declared.keySchema.fields.map(f => (f.name, f.dataType))
    if (!oldKey.sameElements(newKey)) {
      throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionKeyChanged,
        s"$operator was keyed by [${keyDescription(stored.keySchema)}] on this checkpoint and is now keyed by " +
          s"[${keyDescription(declared.keySchema)}]; the key of a keyed function cannot change on an existing " +
          "checkpoint (key_by the old columns, or start a new checkpoint)")
    }
    declared.states.foreach { now =>
      stored.states.find(_.name == now.name).foreach { was =>
        if (was.kind != now.kind || was.valueType != now.valueType || was.mapKeyType != now.mapKeyType) {
          throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionStateChanged,
            s"state '${now.name}' (column family '${now.toVar.columnFamily}') of $operator was stored as " +
              s"${was.describe} and is now declared as ${now.describe}; a state's kind and type cannot change on " +
              "an existing checkpoint (use a new state name)")
        }
      }
    }
    val kept = stored.states.filterNot(s => declared.states.exists(_.name == s.name))
    declared.copy(states = declared.states ++ kept)
  }

  /** The stateful operator as errors name it: Spark's own check of its operators does not. */
  private def operatorName(operatorId: Long, declared: OperatorDeclaration, partition: Option[Int]): String = {
    val where = partition.fold("")(p => s", partition $p")
    s"stateful operator $operatorId (KeyedStateApplyExec / keyed function ${declared.describe}, state store " +
      s"'${StateStoreId.DEFAULT_STORE_NAME}'$where)"
  }

  private def missing(manifest: Path, version: Long, operatorId: Long): Nothing =
    throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionDeclarationMissing,
      s"state version $version of stateful operator $operatorId has no keyed function declaration in its " +
        s"manifest $manifest, so its states cannot be read safely: it was written by a keyedstate build from " +
        "before declarations were kept in manifests, or by an operator that is not a keyed function. Start a new " +
        "checkpoint")

  /**
   * In each task, before any state is read: checks the loaded version's declaration and declares
   * the reconciled one, committed with the batch. A version after the first without one is refused.
   */
  def checkAndDeclare(store: TaskStateStore, declared: OperatorDeclaration, operatorId: Long, partition: Int): Unit = {
    // Every batch after the first finds the very declaration it declares: nothing to parse.
    if (store.declaration.contains(declared.toJson)) return
    val stored = store.declaration.flatMap(fromJson(_, s"manifest ${store.loadedManifest}"))
    val merged = stored match {
      case Some(s) => reconcile(s, declared, operatorId, Some(partition))
      case None if store.version > 0 => missing(store.loadedManifest, store.version, operatorId)
      case None => declared
    }
    store.declare(merged.toJson)
  }

  /**
   * On the driver when a run starts, before its first batch: the declaration partition 0's
   * manifest records for the version the batch loads. Every task checks its own partition too.
   */
  def checkAtStart(declared: OperatorDeclaration, info: StatefulOperatorStateInfo, hadoopConf: Configuration): Unit =
    if (info.storeVersion > 0) {
      val checkpointId = info.stateStoreCkptIds.flatMap(_.headOption).flatMap(_.headOption)
      val stored = read(new Path(new Path(info.checkpointLocation, info.operatorId.toString), "0"),
        info.storeVersion, checkpointId, hadoopConf, info.operatorId)
      reconcile(stored, declared, info.operatorId, None)
    }

  /**
   * The declaration of a store partition's `version` (its manifest; `checkpointId` under format v2):
   * a missing manifest fails as a missing checkpoint file, one without a declaration is refused.
   */
  def read(partitionDir: Path, version: Long, checkpointId: Option[String], hadoopConf: Configuration,
      operatorId: Long): OperatorDeclaration = {
    val store = new CheckpointStore(partitionDir, hadoopConf)
    val manifestPath = store.manifestPath(version, checkpointId)
    val manifest = store.readManifest(manifestPath, version)
    manifest.declaration.flatMap(fromJson(_, s"manifest $manifestPath")).getOrElse(missing(manifestPath, version, operatorId))
  }
}
