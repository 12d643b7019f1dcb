package io.keyedstate.queryable

import java.net.URI
import java.net.http.{HttpClient, HttpRequest, HttpResponse}
import java.nio.charset.StandardCharsets.UTF_8
import java.time.Duration
import java.util.UUID
import java.util.concurrent.{CompletableFuture, ConcurrentHashMap}

import scala.util.control.NonFatal

import org.apache.spark.SparkContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution
import org.json4s._
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

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
      // Kept once complete: a run's queryable states do not change (before its first batch is
      // planned, or an operator's schema file is written, they are asked again).
      val (found, complete) = QueryableStates.of(query)
      if (complete) catalogs.put(query.runId, found)
      found
    }
  }

  def forget(runId: UUID): Unit = {
    catalogs.remove(runId)
    latest.remove(runId)
  }

  /**
   * The values of `keys` in state `name` at the query's last committed batch, at least
   * `minBatch`: `{"batch", "values": [...]}`, values in `keys`' order.
   */
  def get(query: StreamExecution, state: QueryableState, keys: Seq[JValue], minBatch: Option[Long],
      timeoutMs: Long, limit: Int, mapKey: Option[JValue] = None): JValue = {
    val deadline = System.nanoTime() + timeoutMs * 1000000L
    val rows = keys.zipWithIndex.map { case (k, i) => keyRow(state, k, s"key #$i") }
    // A map state's whole map per key (a scan of its entries), or the value of one map key.
    val entry = mapKey.map { m =>
      val keyType = state.mapKeyType.filter(_ => state.answer == Answer.Entries).getOrElse(
        throw new LookupRefused(400, ErrorId.ServiceBadRequest, s"\"map_key\" reads one entry of a map state; " +
          s"'${state.name}' is ${state.kind} state"))
      try JsonValues.toInternal(m, keyType, "map_key") catch {
        case e: JsonValues.BadValue => throw new LookupRefused(400, ErrorId.ServiceBadRequest, e.getMessage)
      }
    }
    val located = state.withCodec(c => rows.map(r => entry.fold(c.locate(r))(c.locateEntry(r, _))))
    val batch = committedBatch(query, minBatch, deadline)
    val read = readVersion(query, state, located, batch + 1, deadline, limit, scan = state.answer == Answer.Entries &&
      entry.isEmpty)
    val values = state.withCodec { c =>
      read.map {
        case Left(bytes) if entry.isDefined => c.entryValueJson(bytes)
        case Left(bytes) => c.valueJson(bytes)
        case Right((entries, _)) if entries.isEmpty => JNull // no state, as for the other kinds
        case Right((entries, more)) =>
          ("entries" -> JArray(entries.toList.map { case (k, v) => c.entryJson(k, v) })) ~ ("more" -> more)
      }
    }
    ("query" -> query.id.toString) ~ ("run" -> query.runId.toString) ~ ("name" -> state.name) ~ ("kind" -> state.kind) ~
      ("batch" -> batch) ~ ("values" -> JArray(values.toList))
  }

  /** A request's key as the key columns' row: a value for one column, an array (or object) for several. */
  private def keyRow(state: QueryableState, key: JValue, what: String): InternalRow = {
    val schema = state.keySchema
    try {
      if (schema.length == 1) InternalRow(JsonValues.toInternal(key, schema.head.dataType, what))
      else key match {
        case JArray(_) | JObject(_) => JsonValues.toInternal(key, schema, what).asInstanceOf[InternalRow]
        case other => throw new JsonValues.BadValue(s"$what is ${JsonMethods.compact(other)}, not an array of " +
          s"${schema.length} key column values")
      }
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

  // The commit log's last batch per query run, listed at most once per LatestBatchCacheMs: a
  // listing of the log's folder costs more than a lookup, and lookups come by the thousand.
  private val latest = new ConcurrentHashMap[UUID, (Long, Option[Long])]()

  private def latestBatch(query: StreamExecution): Option[Long] = {
    val now = System.nanoTime()
    val cached = latest.get(query.runId)
    if (cached != null && now - cached._1 < LatestBatchCacheMs * 1000000L) cached._2
    else {
      val found = query.commitLog.getLatestBatchId()
      latest.put(query.runId, (now, found))
      found
    }
  }

  /**
   * Each located key's stored value (or, to `scan`, its entries: a map state's) at `version`
   * of the query's run, asked of the servers holding their partitions, one read per partition,
   * all at once (a server in this JVM, local mode's, is read directly).
   */
  private def readVersion(query: StreamExecution, state: QueryableState, located: Seq[(Int, Array[Byte])],
      version: Long, deadline: Long, limit: Int, scan: Boolean)
      : Seq[Either[Array[Byte], (Seq[(Array[Byte], Array[Byte])], Boolean)]] = {
    val token = StateServers.token(sc).getOrElse(throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
      s"queryable state needs keyedstate's Spark plugin: start the application with spark.plugins=" +
        s"${QueryablePlugin.ClassName} (keyedstate.configure sets it)"))
    val map = scan
    val runId = query.runId.toString
    def waitMs = math.max(0L, math.min(ServerWaitMs, (deadline - System.nanoTime()) / 1000000L))
    val byPartition = located.zipWithIndex.groupBy(_._1._1).toSeq
    val reads = byPartition.map { case (p, keys) =>
      val partition = state.partition(p)
      val (executor, url) = StateServers.holder(partition, runId).getOrElse(throw new LookupRefused(503,
        ErrorId.ServiceStateUnavailable, s"no state server holds $partition for the query's run $runId (the " +
          "query is starting or restarting, has run no batch since it started, or its executor was lost); ask again"))
      val encoded = keys.map(_._1._2)
      val read = ViewRead(partition, runId, version, state.column, if (map) Nil else encoded,
        if (map) encoded else Nil, limit, waitMs)
      val answer =
        if (executor != LocalExecutorId) remoteRead(url, token, read, deadline)
        else if (byPartition.size == 1) CompletableFuture.completedFuture(localRead(read)) // no thread handoff
        else CompletableFuture.supplyAsync(() => localRead(read.copy(waitMs = waitMs)))
      (keys.map(_._2), url, read, answer)
    }
    val out = new Array[Either[Array[Byte], (Seq[(Array[Byte], Array[Byte])], Boolean)]](located.length)
    reads.foreach { case (indices, url, read, future) =>
      val answer = future.join() match {
        case Right(a) => a
        case Left(e: StateServer.Refused) if e.kind == StateServer.VersionNotHeld => throw new LookupRefused(503,
          ErrorId.ServiceStateUnavailable, s"the state server at $url does not hold version $version of " +
            s"${read.partition} (it holds ${if (e.versions.isEmpty) "none" else e.versions.mkString(", ")}); ask again")
        case Left(e: Unreachable) => throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
          s"the state server at $url holding ${read.partition} does not answer: ${e.getMessage}; ask again")
        case Left(e) => throw new IllegalStateException(
          s"the state server at $url failed to read ${read.partition}: ${e.getMessage}", e) // 500, logged
      }
      if (map) indices.zip(answer.scans).foreach { case (i, scan) => out(i) = Right(scan) }
      else indices.zip(answer.values).foreach { case (i, v) => out(i) = Left(v) }
    }
    out.toSeq
  }

  private def localRead(read: ViewRead): Either[Throwable, ViewAnswer] =
    try Right(StateServer.read(read)) catch { case NonFatal(e) => Left(e) }

  private def remoteRead(url: String, token: String, read: ViewRead, deadline: Long)
      : CompletableFuture[Either[Throwable, ViewAnswer]] = {
    val request = HttpRequest.newBuilder(URI.create(url + StateServer.ReadPath))
      .timeout(Duration.ofMillis(math.max(1L, (deadline - System.nanoTime()) / 1000000L)))
      .header("Authorization", s"Bearer $token")
      .POST(HttpRequest.BodyPublishers.ofString(JsonMethods.compact(JsonMethods.render(StateServer.readJson(read))),
        UTF_8)).build()
    http.sendAsync(request, HttpResponse.BodyHandlers.ofString(UTF_8)).handle { (response, failure) =>
      if (failure != null) Left(new Unreachable(String.valueOf(Option(failure.getCause).getOrElse(failure))))
      else try {
        val body = JsonMethods.parse(response.body())
        if (response.statusCode() == 200) Right(StateServer.answerOf(body))
        else Left(new StateServer.Refused(response.statusCode(), (body \ "error").extractOpt[String].getOrElse("?"),
          s"HTTP ${response.statusCode()}: ${(body \ "message").extractOpt[String].getOrElse(response.body())}",
          (body \ "versions").extractOpt[List[Long]].getOrElse(Nil)))
      } catch {
        case NonFatal(e) => Left(new IllegalStateException(s"an answer that is not a state server's: ${e.getMessage}"))
      }
    }
  }
}

object StateLookups {
  implicit private val formats: Formats = DefaultFormats
  /** How long a state server waits for a version being committed. */
  private val ServerWaitMs = 2000L
  /** Local mode's one executor, in the driver's JVM (Spark's `SparkContext.DRIVER_IDENTIFIER`). */
  private val LocalExecutorId = "driver"
  /** How long the last committed batch read off the commit log is trusted (bounds freshness). */
  private val LatestBatchCacheMs = 10L

  /** A state server that did not answer (connection refused or lost, timed out). */
  private final class Unreachable(message: String) extends Exception(message)

  /** A lookup refused, with the HTTP status and error id the service answers. */
  final class LookupRefused(val status: Int, val id: ErrorId, message: String) extends Exception(message)
}
