package io.keyedstate.queryable

import java.net.URI
import java.net.http.{HttpClient, HttpRequest, HttpResponse}
import java.nio.charset.StandardCharsets.UTF_8
import java.time.Duration
import java.util.{Base64, UUID}
import java.util.concurrent.{CompletableFuture, ConcurrentHashMap}

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.spark.SparkContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution
import org.json4s._
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.engine.StateKind
import io.keyedstate.errors.ErrorId

/**
 * The driver's proxy for lookups of queryable state (Flink's `KvStateClientProxy`): finds the
 * partition of each key with the query's own hash, the executor whose state server holds that
 * partition's committed views, asks it for the version of the query's last committed batch
 * (or waits for a batch a request names), and decodes the stored values.
 */
final class StateLookups(sc: SparkContext) {
  import StateLookups._

  private val http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
    .connectTimeout(Duration.ofSeconds(5)).build()
  // The queryable states of each query run, read off its plan once it has one.
  private val catalogs = new ConcurrentHashMap[UUID, Seq[QueryableState]]()

  /** The queryable states of `query`'s run (none before its first batch is planned). */
  def states(query: StreamExecution): Seq[QueryableState] = {
    val known = catalogs.get(query.runId)
    if (known != null) known
    else {
      val found = QueryableStates.of(query)
      if (query.lastExecution != null) catalogs.put(query.runId, found)
      found
    }
  }

  def forget(runId: UUID): Unit = catalogs.remove(runId)

  /**
   * The values of `keys` in state `name` at the query's last committed batch, at least
   * `minBatch`: `{"batch", "values": [...]}`, values in `keys`' order.
   */
  def get(query: StreamExecution, state: QueryableState, keys: Seq[JValue], minBatch: Option[Long],
      timeoutMs: Long, limit: Int): JValue = {
    val deadline = System.nanoTime() + timeoutMs * 1000000L
    val rows = keys.zipWithIndex.map { case (k, i) => keyRow(state, k, s"key #$i") }
    val located = state.withCodec(c => rows.map(c.locate))
    val batch = committedBatch(query, minBatch, deadline)
    val read = readVersion(state, located, batch + 1, deadline, limit)
    val values = state.withCodec { c =>
      read.map {
        case Left(bytes) => c.valueJson(bytes)
        case Right((entries, _)) if entries.isEmpty => JNull // no state, as for the other kinds
        case Right((entries, more)) =>
          ("entries" -> JArray(entries.toList.map { case (k, v) => c.entryJson(k, v) })) ~ ("more" -> more)
      }
    }
    ("query" -> query.id.toString) ~ ("name" -> state.name) ~ ("kind" -> state.state.declaredKind) ~
      ("batch" -> batch) ~ ("values" -> JArray(values.toList))
  }

  /** A request's key as the key columns' row: a value for one column, an array (or object) for several. */
  private def keyRow(state: QueryableState, key: JValue, what: String): InternalRow = {
    val schema = state.keySchema
    try {
      if (schema.length == 1) InternalRow(JsonValues.toInternal(key, schema.head.dataType, what))
      else JsonValues.toInternal(key, schema, what).asInstanceOf[InternalRow]
    } catch {
      case e: JsonValues.BadValue => throw new LookupRefused(400, ErrorId.ServiceBadRequest,
        s"${e.getMessage}; the keys of '${state.name}' are (${schema.fields.map(f =>
          s"${f.name} ${f.dataType.simpleString}").mkString(", ")})")
    }
  }

  /** The query's last committed batch, once it is at least `minBatch` (waited for until `deadline`). */
  private def committedBatch(query: StreamExecution, minBatch: Option[Long], deadline: Long): Long = {
    var last = latestBatch(query)
    while (minBatch.exists(m => last.forall(_ < m)) && System.nanoTime() < deadline) {
      Thread.sleep(5)
      last = latestBatch(query)
    }
    (last, minBatch) match {
      case (Some(b), Some(m)) if b < m => throw new LookupRefused(504, ErrorId.ServiceBatchNotReached,
        s"query ${query.id} did not commit batch $m within the request's timeout: its last committed batch is $b")
      case (None, Some(m)) => throw new LookupRefused(504, ErrorId.ServiceBatchNotReached,
        s"query ${query.id} did not commit batch $m within the request's timeout: it has committed no batch yet")
      case (None, None) => throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
        s"query ${query.id} has committed no batch yet: its state is queryable from its first committed batch on")
      case (Some(b), _) => b
    }
  }

  private def latestBatch(query: StreamExecution): Option[Long] = query.commitLog.getLatestBatchId()

  /**
   * Each located key's stored value (value and list state) or entries (map state) at `version`,
   * asked of the servers holding their partitions, one request per partition, all at once.
   */
  private def readVersion(state: QueryableState, located: Seq[(Int, Array[Byte])], version: Long, deadline: Long,
      limit: Int): Seq[Either[Array[Byte], (Seq[(Array[Byte], Array[Byte])], Boolean)]] = {
    val token = StateServers.token(sc).getOrElse(throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
      s"queryable state needs keyedstate's Spark plugin: start the application with spark.plugins=" +
        s"${QueryablePlugin.ClassName} (keyedstate.configure sets it)"))
    val map = state.kind == StateKind.Map
    val byPartition = located.zipWithIndex.groupBy(_._1._1)
    val requests = byPartition.toSeq.map { case (p, keys) =>
      val partition = state.partition(p)
      val (_, url) = StateServers.holder(partition).getOrElse(throw new LookupRefused(503,
        ErrorId.ServiceStateUnavailable, s"no state server holds $partition (the query is restarting, or its " +
          "executor was lost); ask again"))
      val encoded = JArray(keys.toList.map { case ((_, k), _) => JString(Base64.getEncoder.encodeToString(k)) })
      val body = ("partition" -> StateServer.partitionJson(partition)) ~ ("version" -> version) ~
        ("family" -> state.column) ~ ("limit" -> limit) ~
        ("wait_ms" -> math.max(0L, math.min(ServerWaitMs, (deadline - System.nanoTime()) / 1000000L))) ~
        (if (map) "prefixes" -> encoded else "gets" -> encoded)
      val request = HttpRequest.newBuilder(URI.create(url + StateServer.ReadPath))
        .timeout(Duration.ofMillis(math.max(1L, (deadline - System.nanoTime()) / 1000000L)))
        .header("Authorization", s"Bearer $token")
        .POST(HttpRequest.BodyPublishers.ofString(JsonMethods.compact(JsonMethods.render(body)), UTF_8)).build()
      (partition, keys.map(_._2), url, http.sendAsync(request, HttpResponse.BodyHandlers.ofString(UTF_8)))
    }
    CompletableFuture.allOf(requests.map(_._4): _*).exceptionally(_ => null).join()
    val out = new Array[Either[Array[Byte], (Seq[(Array[Byte], Array[Byte])], Boolean)]](located.length)
    requests.foreach { case (partition, indices, url, future) =>
      val response = try future.join() catch {
        case NonFatal(e) => throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
          s"the state server at $url holding $partition did not answer: ${Option(e.getCause).getOrElse(e).toString}")
      }
      val answer = JsonMethods.parse(response.body())
      if (response.statusCode() != 200) {
        val held = (answer \ "versions").extractOpt[List[Long]].getOrElse(Nil)
        throw new LookupRefused(503, ErrorId.ServiceStateUnavailable, s"the state server at $url does not hold " +
          s"version $version of $partition (it holds ${if (held.isEmpty) "none" else held.mkString(", ")}): " +
          s"${(answer \ "message").extractOpt[String].getOrElse(response.body())}; ask again")
      }
      def bytes(v: JValue): Array[Byte] = v match {
        case JString(s) => Base64.getDecoder.decode(s)
        case _ => null
      }
      if (map) {
        val scans = (answer \ "scans").extract[List[JValue]]
        indices.zip(scans).foreach { case (i, scan) =>
          val entries = (scan \ "entries").extract[List[List[JValue]]].map(e => bytes(e.head) -> bytes(e(1)))
          out(i) = Right(entries -> (scan \ "more").extract[Boolean])
        }
      } else {
        val values = (answer \ "values").extract[List[JValue]]
        indices.zip(values).foreach { case (i, v) => out(i) = Left(bytes(v)) }
      }
    }
    out.toSeq
  }
}

object StateLookups {
  implicit private val formats: Formats = DefaultFormats
  /** How long a state server waits for a version being committed. */
  private val ServerWaitMs = 2000L

  /** A lookup refused, with the HTTP status and error id the service answers. */
  final class LookupRefused(val status: Int, val id: ErrorId, message: String) extends Exception(message)
}
