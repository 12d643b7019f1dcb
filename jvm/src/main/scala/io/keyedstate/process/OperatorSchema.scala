package io.keyedstate.process

import java.nio.charset.StandardCharsets

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.apache.spark.sql.types._
import org.json4s._
import org.json4s.jackson.JsonMethods

import io.keyedstate.errors.ErrorId

/**
 * A keyed function's declared layout, kept with its state (`state/<op>/_keyedstate/schema.json`):
 * the key columns with their types and every state variable's kind and types. Checked when a run
 * starts, before its first batch: changed key columns or a state's changed kind or type are
 * refused, naming both declarations. States no longer declared stay stored (and listed).
 */
object OperatorSchema {
  private implicit val formats: Formats = DefaultFormats

  final case class StoredState(name: String, kind: String, valueType: DataType, mapKeyType: Option[DataType],
      ttl: Map[String, String]) {
    def toVar: StateVar =
      StateVar(name, StateKind.parse(kind), kind, valueType, mapKeyType, if (ttl.isEmpty) None else Some(StateTtl(ttl)))
  }
  final case class Stored(function: String, keySchema: StructType, states: Seq[StoredState])

  def path(info: StatefulOperatorStateInfo): Path =
    new Path(new Path(info.checkpointLocation, info.operatorId.toString), "_keyedstate/schema.json")

  def read(file: Path, hadoopConf: Configuration): Option[Stored] = {
    val fs = file.getFileSystem(hadoopConf)
    if (!fs.exists(file)) None
    else {
      val in = fs.open(file)
      val text = try new String(in.readAllBytes(), StandardCharsets.UTF_8) finally in.close()
      val root = JsonMethods.parse(text)
      def dt(v: JValue) = DataType.fromJson(JsonMethods.compact(v))
      Some(Stored(
        (root \ "function").extract[String],
        dt(root \ "keySchema").asInstanceOf[StructType],
        (root \ "states").extract[List[JValue]].map { s =>
          StoredState((s \ "name").extract[String], (s \ "kind").extract[String], dt(s \ "type"),
            (s \ "keyType") match { case JNothing | JNull => None; case v => Some(dt(v)) },
            (s \ "ttl") match { case o: JObject => o.obj.map { case (k, v) => k -> v.extract[String] }.toMap; case _ => Map.empty })
        }))
    }
  }

  private def describe(kind: String, t: DataType, k: Option[DataType]): String =
    k.fold(s"$kind state of ${t.simpleString}")(kt => s"$kind state of ${kt.simpleString} -> ${t.simpleString}")

  private def keyDescription(s: StructType): String = s.fields.map(f => s"${f.name} ${f.dataType.simpleString}").mkString(", ")

  /** The operator as a schema error names it: Spark's own check of its operators does not. */
  private def operator(spec: ProcessSpec, info: StatefulOperatorStateInfo): String =
    s"stateful operator ${info.operatorId} (KeyedStateApplyExec / keyed function ${spec.functionName}, " +
      s"state store '${StateStoreId.DEFAULT_STORE_NAME}')"

  /** Validates the declaration against the stored one and writes the merged one; returns its path. */
  def validateAndWrite(spec: ProcessSpec, input: StructType, info: StatefulOperatorStateInfo,
      hadoopConf: Configuration): Path = {
    val file = path(info)
    val layout = new StateLayout(spec, input)
    val stored = read(file, hadoopConf)
    stored.foreach { old =>
      val oldKey = old.keySchema.fields.map(f => (f.name, f.dataType))
      val newKey = layout.keySchema.fields.map(f => (f.name, f.dataType))
      if (!oldKey.sameElements(newKey)) {
        throw new KeyedProcessError(ErrorId.KeyedFunctionKeyChanged,
          s"${operator(spec, info)} was keyed by " +
            s"[${keyDescription(old.keySchema)}] on this checkpoint and is now keyed by " +
            s"[${keyDescription(layout.keySchema)}]; the key of a keyed function cannot change on an " +
            "existing checkpoint (key_by the old columns, or start a new checkpoint)")
      }
      spec.states.foreach { v =>
        old.states.find(_.name == v.name).foreach { case StoredState(_, kind, t, k, _) =>
          if (kind != v.declaredKind || t != v.valueType || k != v.mapKeyType) {
            throw new KeyedProcessError(ErrorId.KeyedFunctionStateChanged,
              s"state '${v.name}' (column family '${v.columnFamily}') of ${operator(spec, info)} was stored as " +
                s"${describe(kind, t, k)} and is now declared as ${describe(v.declaredKind, v.valueType, v.mapKeyType)}; " +
                "a state's kind and type cannot change on an existing checkpoint (use a new state name)")
          }
        }
      }
    }
    val kept = stored.toSeq.flatMap(_.states).filterNot(s => spec.states.exists(_.name == s.name))
    val all = spec.states.map(v => StoredState(v.name, v.declaredKind, v.valueType, v.mapKeyType,
      v.ttl.map(_.options).getOrElse(Map.empty))) ++ kept
    val json = JObject(
      "function" -> JString(spec.functionName),
      "keySchema" -> JsonMethods.parse(layout.keySchema.json),
      "timers" -> JBool(spec.timers),
      "states" -> JArray(all.toList.map { case StoredState(name, kind, t, k, ttl) =>
        JObject(List("name" -> JString(name), "kind" -> JString(kind), "type" -> JsonMethods.parse(t.json)) ++
          k.map(kt => "keyType" -> JsonMethods.parse(kt.json)).toList ++
          (if (ttl.isEmpty) Nil else List("ttl" -> JObject(ttl.toList.map { case (o, v) => o -> JString(v) }))))
      }))
    // Spark's CheckpointFileManager picks the atomic write each file system supports.
    val files = CheckpointFileManager.create(file.getParent, hadoopConf)
    files.mkdirs(file.getParent) // createAtomic does not create it
    val out = files.createAtomic(file, overwriteIfPossible = true)
    try out.write(JsonMethods.pretty(json).getBytes(StandardCharsets.UTF_8)) catch {
      case e: Throwable => out.cancel(); throw e
    }
    out.close()
    file
  }
}
