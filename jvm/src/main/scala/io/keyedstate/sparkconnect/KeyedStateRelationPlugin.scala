package io.keyedstate.sparkconnect

import java.util.Optional

import org.apache.spark.sql.catalyst.plans.logical.{LocalRelation, LogicalPlan}
import org.apache.spark.sql.connect.ConnectProtoUtils
import org.apache.spark.sql.connect.planner.SparkConnectPlanner
import org.apache.spark.sql.connect.plugin.RelationPlugin
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types.{DataType, StructType}
import org.json4s._
import org.json4s.jackson.JsonMethods

import io.keyedstate.engine.{KeyedProcess, KeyedProcessPlan}
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.offline.StateReader

/**
 * keyedstate's relations on Spark Connect (registered with
 * `spark.connect.extensions.relation.classes`): the Python client sends each as an extension
 * relation ([[ExtensionMessage]]) and this plugin plans it as py4j's entry points do in a
 * classic session ([[KeyedProcess]]), so a keyed function is the same plan either way:
 * `lookup` over the keyed stream's relation, Spark's own `mapInArrow` (the client's), `apply`
 * over that. The offline operations are relations too: the state reader's DataFrame, and the
 * others a command whose one row is the operation's JSON answer ([[ConnectOperations]]).
 */
final class KeyedStateRelationPlugin extends RelationPlugin {
  import KeyedStateRelationPlugin._

  override def transform(relation: Array[Byte], planner: SparkConnectPlanner): Optional[LogicalPlan] =
    ExtensionMessage.decode(relation) match {
      case Some(message) => Optional.of(plan(message, planner))
      case None => Optional.empty() // another library's relation
    }

  private def plan(message: ExtensionMessage, planner: SparkConnectPlanner): LogicalPlan = {
    checkVersion(message)
    val session = planner.session
    def relationIn(holder: JValue, field: String): Option[LogicalPlan] =
      message.relationAt(holder \ field).map { bytes =>
        planner.transformRelation(ConnectProtoUtils.parseRelationWithRecursionLimit(bytes, RecursionLimit))
      }
    def relation(field: String): Option[LogicalPlan] = relationIn(message.body, field)
    def relationAt(holder: JValue, field: String): LogicalPlan =
      relationIn(holder, field).getOrElse(throw bad(message, s"'$field' is missing"))
    def text(field: String): String = message.body \ field match {
      case JString(s) => s
      case other => throw bad(message, s"'$field' must be a string, got ${JsonMethods.compact(other)}")
    }
    def frame(plan: LogicalPlan) = KeyedProcessSqlBridge.ofRows(session, plan)
    def required(field: String) = relation(field).getOrElse(throw bad(message, s"'$field' is missing"))
    message.kind match {
      case Lookup =>
        KeyedProcessSqlBridge.logicalPlan(KeyedProcess.lookup(frame(required("input")),
          relation("broadcast").map(frame).orNull, text("spec")))
      case Apply =>
        KeyedProcessSqlBridge.logicalPlan(KeyedProcess.apply(frame(required("input")), text("spec"),
          text("inputSchema")))
      case Operation =>
        val frames = message.body \ "frames" match {
          case JObject(fields) => fields.map { case (name, _) => name -> relationAt(message.body \ "frames", name) }.toMap
          case JNothing | JNull => Map.empty[String, LogicalPlan]
          case other => throw bad(message, s"'frames' must be an object of relations, got ${JsonMethods.compact(other)}")
        }
        ConnectOperations.command(text("name"), message.body \ "arguments", frames)
      case StateRead =>
        val batchId = message.body \ "batchId" match {
          case JInt(n) if n.isValidLong => n.toLong
          case other => throw bad(message, s"'batchId' must be a long (-1: the last), got ${JsonMethods.compact(other)}")
        }
        val flatten = message.body \ "flatten" match {
          case JBool(b) => b
          case other => throw bad(message, s"'flatten' must be a boolean, got ${JsonMethods.compact(other)}")
        }
        KeyedProcessSqlBridge.logicalPlan(StateReader.read(session, text("path"), text("operator"), text("state"),
          batchId, flatten))
      case OutSchema =>
        // No rows: the client asks its schema (what mapInArrow's function returns).
        val schema = DataType.fromJson(KeyedProcess.outSchemaJson(text("spec"), text("inputSchema")))
          .asInstanceOf[StructType]
        LocalRelation(KeyedProcessPlan.attributes(schema))
      case other => throw bad(message, s"unknown relation '$other'; this server's keyedstate plans ${Kinds.mkString(", ")}")
    }
  }
}

object KeyedStateRelationPlugin {
  /** The jar's keyedstate version (its manifest's); None when run from classes (the build's tests). */
  val ServerVersion: Option[String] = Option(classOf[KeyedStateRelationPlugin].getPackage)
    .flatMap(p => Option(p.getImplementationVersion))

  /**
   * The client's keyedstate plans the relation (the spec, the runner) and the server's runs it:
   * one version on both sides, or a clear refusal instead of a plan that fails later.
   */
  private def checkVersion(message: ExtensionMessage): Unit = ServerVersion.foreach { server =>
    val client = message.body \ "client" match {
      case JString(v) => v
      case _ => "unknown (it sent none)"
    }
    if (client != server) {
      throw KeyedStateErrors.badArgument(ErrorId.ConnectVersionMismatch,
        s"this Spark Connect client runs keyedstate $client and the server runs keyedstate $server: install " +
          s"keyedstate $server where the client runs (pip install keyedstate==$server), or start the server with " +
          s"the client's version")
    }
  }

  /** The plugin's class, for `spark.connect.extensions.relation.classes`. */
  val ClassName: String = classOf[KeyedStateRelationPlugin].getName

  val Lookup = "lookup"
  val Apply = "apply"
  val OutSchema = "outSchema"
  /** An offline operation ([[ConnectOperations]]), run when the relation executes. */
  val Operation = "operation"
  /** `keyedstate.state.read`'s DataFrame. */
  val StateRead = "stateRead"
  private val Kinds = Seq(Lookup, Apply, OutSchema, Operation, StateRead)

  // Spark's own bound on a relation's nesting (spark.connect.grpc.marshallerRecursionLimit's default).
  private val RecursionLimit = 1024

  private def bad(message: ExtensionMessage, why: String) =
    new IllegalArgumentException(s"keyedstate's Spark Connect relation '${message.kind}': $why (is the client's " +
      "keyedstate the server's version?)")
}
