package io.keyedstate.sparkconnect

import scala.jdk.CollectionConverters._

import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeReference}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.execution.command.LeafRunnableCommand
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types.StringType
import org.json4s._
import org.json4s.jackson.JsonMethods

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.offline.inspect.CheckpointInspector
import io.keyedstate.offline.rescale.Rescaler
import io.keyedstate.offline.savepoint.SavepointCommands
import io.keyedstate.sinks.{KafkaSinkSettings, KafkaSinkWriter}

/**
 * The offline operations by name (the one registry of them): a classic session's Python calls
 * [[run]] through py4j, a Spark Connect client sends an `operation` relation planned as a
 * [[RunOperation]] command that calls it. Arguments come as a JSON array, each read as its
 * entry point takes it; the answer is the entry point's JSON.
 */
object ConnectOperations {
  private type Operation = (SparkSession, Arguments) => String

  private val operations: Map[String, Operation] = Map(
    "inspect" -> ((s, a) => CheckpointInspector.report(s, a.text(0), a.int(1))),
    "rescale" -> ((s, a) => Rescaler.rescale(s, a.text(0), a.int(1), a.text(2), a.bool(3))),
    "savepoint.create" -> ((s, a) => SavepointCommands.create(s, a.text(0), a.text(1), a.text(2))),
    "savepoint.restore" -> ((s, a) =>
      SavepointCommands.restore(s, a.text(0), a.text(1), a.int(2), a.text(3), a.bool(4))),
    "savepoint.inspect" -> ((s, a) => SavepointCommands.inspect(s, a.text(0), a.bool(1))),
    "savepoint.list" -> ((s, a) => SavepointCommands.list(s, a.text(0))),
    "savepoint.dispose" -> ((s, a) => SavepointCommands.dispose(s, a.text(0))),
    "savepoint.bootstrap" -> ((s, a) => SavepointCommands.bootstrap(s, a.text(0), a.text(1))),
    "savepoint.clearBootstrap" -> ((s, a) => SavepointCommands.clearBootstrap(s, a.text(0))),
    "savepoint.transform" -> ((s, a) => SavepointCommands.transform(s, a.text(0), a.text(1), a.text(2), a.text(3),
      a.text(4), a.frames)),
    "query.info" -> ((s, a) => runningQueryInfo(s, a.text(0))),
    "checkpoint.qualify" -> ((s, a) => JsonMethods.compact(JString(qualified(s, a.text(0))._2.toString))),
    "checkpoint.delete" -> ((s, a) => deleteCheckpoint(s, a.text(0))),
    // A Connect client's foreachBatch runs in the server's Python process: its batch comes back
    // here as a frame (the classic session hands KafkaSinkWriter the batch's DataFrame itself).
    "sink.kafka.write" -> ((_, a) => {
      KafkaSinkWriter.write(a.frame("batch"), a.long(0), kafkaSettings(a, 1), a.bool(2))
      "{}"
    }))

  val Names: Seq[String] = operations.keys.toSeq.sorted

  /**
   * The command that runs operation `name` when the relation is executed (once per request);
   * `frames`: the DataFrames it is given (a transform's new rows), by name.
   */
  def command(name: String, arguments: JValue, frames: Map[String, LogicalPlan]): RunOperation = {
    known(name)
    RunOperation(name, JsonMethods.compact(JArray(array(arguments))), frames)
  }

  /** Runs operation `name` with `arguments` (a JSON array) and `frames`: its JSON answer. */
  def run(session: SparkSession, name: String, arguments: String, frames: java.util.Map[String, DataFrame]): String =
    known(name)(session, new Arguments(name, array(JsonMethods.parse(arguments)), frames))

  private def known(name: String): Operation = operations.getOrElse(name, throw new IllegalArgumentException(
    s"unknown operation '$name'; this keyedstate runs ${Names.mkString(", ")}"))

  private def array(arguments: JValue): List[JValue] = arguments match {
    case JArray(items) => items
    case other => throw new IllegalArgumentException(s"an operation's arguments are a JSON array, not ${JsonMethods.compact(other)}")
  }

  /**
   * A running query of the session: its checkpoint (to stop it with a savepoint, to delete it on
   * cancellation) and its trigger (whether its end without error was a finish or a stop), as
   * JSON `{"checkpoint": ..., "trigger": ...}`.
   */
  private def runningQueryInfo(session: SparkSession, id: String): String = {
    val query = Option(session.streams.get(id)).getOrElse(throw KeyedStateErrors.badArgument(
      ErrorId.QueryCheckpointInvalid, s"query $id does not run in this session: stop_with_savepoint and the " +
        "supervisor read a running query's checkpoint; take keyedstate.savepoint(spark, <its checkpoint>, " +
        "<target>) of a stopped one"))
    query match {
      case wrapper: io.keyedstate.shims.SparkTypes.StreamingQueryWrapper =>
        val running = wrapper.streamingQuery
        JsonMethods.compact(JObject(
          "checkpoint" -> JString(running.resolvedCheckpointRoot),
          "trigger" -> JString(running.trigger.toString)))
      case other => throw new IllegalStateException(s"query $id is a ${other.getClass.getName}")
    }
  }

  private def qualified(session: SparkSession, location: String): (FileSystem, Path) = {
    val path = new Path(location)
    val fs = path.getFileSystem(session.sessionState.newHadoopConf())
    (fs, fs.makeQualified(path))
  }

  /**
   * Deletes the streaming checkpoint at `location` (the supervisor's DELETE_ON_CANCELLATION of a
   * Connect client's query): a folder without a query's offset log or metadata is refused, since
   * the client names it; `{"deleted": false}` when there is nothing there.
   */
  private def deleteCheckpoint(session: SparkSession, location: String): String = {
    val (fs, path) = qualified(session, location)
    if (!fs.exists(path)) return """{"deleted":false}"""
    if (!fs.exists(new Path(path, "offsets")) && !fs.exists(new Path(path, "metadata")))
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
        s"$path is not a streaming query's checkpoint (no offsets folder, no metadata file): not deleted")
    if (!fs.delete(path, true)) throw new java.io.IOException(s"could not delete checkpoint $path")
    """{"deleted":true}"""
  }

  /** The Kafka sink's settings, a JSON object at argument `i` (`KafkaSink._settings_fields`). */
  private def kafkaSettings(a: Arguments, i: Int): KafkaSinkSettings = {
    val fields = a.fields(i)
    def field(name: String): JValue = fields.getOrElse(name,
      throw new IllegalArgumentException(s"the Kafka sink's settings have no '$name'"))
    def text(name: String): String = field(name) match {
      case JString(v) => v
      case JNull => null
      case other => throw new IllegalArgumentException(s"the Kafka sink's '$name' must be a string, got ${JsonMethods.compact(other)}")
    }
    def millis(name: String): Int = field(name) match {
      case JInt(v) if v.isValidInt => v.toInt
      case JLong(v) if v.isValidInt => v.toInt
      case other => throw new IllegalArgumentException(s"the Kafka sink's '$name' must be an int, got ${JsonMethods.compact(other)}")
    }
    val config = field("config") match {
      case JObject(entries) => entries.map {
        case (k, JString(v)) => k -> v
        case (k, other) => throw new IllegalArgumentException(s"the Kafka client setting '$k' must be a string, got ${JsonMethods.compact(other)}")
      }.toMap
      case other => throw new IllegalArgumentException(s"the Kafka sink's 'config' must be an object, got ${JsonMethods.compact(other)}")
    }
    KafkaSinkSettings.create(text("topic"), text("bootstrapServers"), text("sinkId"), text("queryId"), config.asJava,
      millis("timeoutMs"), millis("transactionTimeoutMs"), text("scope"))
  }

  /** An operation's arguments, each read as the type its entry point takes. */
  private final class Arguments(operation: String, values: List[JValue],
      val frames: java.util.Map[String, DataFrame]) {
    private def at(i: Int): JValue = values.lift(i).getOrElse(
      throw new IllegalArgumentException(s"operation '$operation' takes at least ${i + 1} arguments, got ${values.size}"))
    private def wrong(i: Int, what: String) = new IllegalArgumentException(
      s"argument ${i + 1} of operation '$operation' must be $what, got ${JsonMethods.compact(at(i))}")
    def text(i: Int): String = at(i) match { case JString(s) => s; case _ => throw wrong(i, "a string") }
    def int(i: Int): Int = at(i) match {
      case JInt(n) if n.isValidInt => n.toInt
      case JLong(n) if n.isValidInt => n.toInt
      case _ => throw wrong(i, "an int")
    }
    def long(i: Int): Long = at(i) match {
      case JInt(n) if n.isValidLong => n.toLong
      case JLong(n) => n
      case _ => throw wrong(i, "a long")
    }
    def bool(i: Int): Boolean = at(i) match { case JBool(b) => b; case _ => throw wrong(i, "a boolean") }
    def fields(i: Int): Map[String, JValue] = at(i) match {
      case JObject(entries) => entries.toMap
      case _ => throw wrong(i, "a JSON object")
    }
    def frame(name: String): DataFrame = Option(frames.get(name)).getOrElse(
      throw new IllegalArgumentException(s"operation '$operation' needs the DataFrame '$name'"))
  }
}

/**
 * An offline operation as a command: run when its plan executes (Spark runs a command once per
 * query execution), its JSON answer the one row of `result`.
 */
final case class RunOperation(name: String, arguments: String, frames: Map[String, LogicalPlan])
    extends LeafRunnableCommand {
  override val output: Seq[Attribute] = Seq(AttributeReference("result", StringType, nullable = false)())

  override def run(session: SparkSession): Seq[Row] = {
    val dataFrames = frames.map { case (k, p) => k -> KeyedProcessSqlBridge.ofRows(session, p) }.asJava
    Seq(Row(ConnectOperations.run(session, name, arguments, dataFrames)))
  }

  override def simpleString(maxFields: Int): String = s"keyedstate $name"
}
