package io.keyedstate.queryable

import java.nio.charset.StandardCharsets.UTF_8
import java.util.Base64

import scala.util.control.NonFatal

import com.sun.net.httpserver.HttpExchange
import org.json4s._
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.{CommittedViews, StorePartition}
import io.keyedstate.errors.{ErrorId, KeyedStateStateException}

/** One read of a partition's committed version: point reads or prefix scans of one column family. */
final case class ViewRead(
    partition: StorePartition,
    runId: String,
    version: Long,
    family: String,
    gets: Seq[Array[Byte]],
    prefixes: Seq[Array[Byte]],
    limit: Int,
    waitMs: Long)

/** What a read found: a value (or null) per point read, the entries (and whether more follow) per scan. */
final case class ViewAnswer(values: Seq[Array[Byte]], scans: Seq[(Seq[(Array[Byte], Array[Byte])], Boolean)])

/**
 * The state server of one executor (Flink's `KvStateServer`): answers the driver's reads from
 * the committed views this JVM holds ([[CommittedViews]]), in stored bytes. It never writes, and
 * reads only the exact version of the exact query run a request names, so an answer is always
 * one committed batch's state. The protocol is internal (docs/queryable-state.md,
 * "Architecture"): the driver's proxy is its only client, with the application's internal token.
 *
 * `POST /internal/v1/read` with `{"partition": {...}, "run", "version", "wait_ms", "family",
 * "gets": [base64 key], "prefixes": [base64 prefix], "limit"}` answers `{"values": [base64 or
 * null], "scans": [{"entries": [[key, value]], "more"}]}`; 404 with the versions held when the
 * version is not, 400 for a request it cannot parse.
 */
final class StateServer(host: String, token: String) extends AutoCloseable {
  import StateServer._

  private val running = HttpServers.start(host, 0, "keyedstate-state-server", HandlerThreads)(serve)

  val url: String = s"http://${HttpServers.urlHost(host)}:${running.port}"

  override def close(): Unit = running.stop()

  /**
   * On the dispatcher thread: a read of a version held here is answered at once; one that may
   * wait for a commit, or scans many entries, on a handler thread.
   */
  private def serve(exchange: HttpExchange): Unit =
    outcome(exchange)(parse(exchange)) match {
      case Right(r) if answersAtOnce(r) => respond(exchange, outcome(exchange)(answerJson(read(r.copy(waitMs = 0)))))
      case Right(r) => running.defer(respond(exchange, outcome(exchange)(answerJson(read(r)))))(
        respond(exchange, Left((503, ("error" -> "stopping") ~ ("message" -> "the state server is stopping")))))
      case Left(refusal) => respond(exchange, Left(refusal))
    }

  /** A read of a version held here, of few entries, that reads no file first (TTL's batch time). */
  private def answersAtOnce(r: ViewRead): Boolean =
    r.gets.size.toLong + r.prefixes.size.toLong * r.limit <= InlineEntries &&
      CommittedViews.readyAt(r.partition, r.runId, r.version, r.family)

  /** `body`, or the status and error it fails with. */
  private def outcome[T](exchange: HttpExchange)(body: => T): Either[(Int, JValue), T] =
    try Right(body) catch {
      case e: Refused => Left((e.status, ("error" -> e.kind) ~ ("message" -> e.getMessage) ~ ("versions" -> e.versions)))
      case NonFatal(e) =>
        logger.warn(s"keyedstate state server: ${exchange.getRequestURI} failed", e)
        Left((500, ("error" -> "failed") ~ ("message" -> String.valueOf(e.getMessage))))
    }

  /** Sends `answer` (computed here: the exchange is closed whatever happens) and closes the exchange. */
  private def respond(exchange: HttpExchange, answer: => Either[(Int, JValue), JValue]): Unit =
    try {
      val (status, body) = answer.fold(identity, 200 -> _)
      val bytes = JsonMethods.compact(JsonMethods.render(body)).getBytes(UTF_8)
      exchange.getResponseHeaders.set("Content-Type", "application/json")
      exchange.sendResponseHeaders(status, bytes.length.toLong)
      exchange.getResponseBody.write(bytes)
    } catch {
      case NonFatal(e) => logger.warn(s"keyedstate state server: cannot answer ${exchange.getRequestURI}", e)
    } finally exchange.close()

  private def parse(exchange: HttpExchange): ViewRead = {
    if (!HttpServers.bearerIs(exchange, token)) {
      throw new Refused(401, "unauthorized", "no internal token, or another", Nil)
    }
    if (exchange.getRequestMethod != "POST" || exchange.getRequestURI.getPath != ReadPath) {
      throw new Refused(404, "not_found", s"no ${exchange.getRequestMethod} ${exchange.getRequestURI.getPath}", Nil)
    }
    val bytes = exchange.getRequestBody.readNBytes(MaxRequestBytes + 1)
    if (bytes.length > MaxRequestBytes) {
      throw new Refused(413, "too_large", s"a read request of more than $MaxRequestBytes bytes", Nil)
    }
    try readOf(JsonMethods.parse(new String(bytes, UTF_8)))
    catch { case NonFatal(e) => throw new Refused(400, "bad_request", s"not a read request: ${e.getMessage}", Nil) }
  }
}

object StateServer {
  implicit private val formats: Formats = DefaultFormats
  private val logger = org.slf4j.LoggerFactory.getLogger(classOf[StateServer])
  // Reads may wait for a version being committed (ServerWaitMs): a few more threads than cores.
  private val HandlerThreads = 8
  private val MaxRequestBytes = 8 * 1024 * 1024
  /** The most values or scanned entries a read (or a lookup) answered on a dispatcher thread may ask for. */
  val InlineEntries = 1000
  val ReadPath = "/internal/v1/read"
  /** The refusal of a read whose version (of its run) this JVM does not hold: the proxy may ask again. */
  val VersionNotHeld = "version_not_held"

  /** A read the server does not serve, with the versions it holds of the partition. */
  final class Refused(val status: Int, val kind: String, message: String, val versions: Seq[Long])
      extends Exception(message)

  private def b64(bytes: Array[Byte]): JValue = if (bytes == null) JNull else JString(Base64.getEncoder.encodeToString(bytes))
  private def unb64(v: JValue): Array[Byte] = v match {
    case JString(s) => Base64.getDecoder.decode(s)
    case _ => null
  }

  def readJson(r: ViewRead): JValue =
    ("partition" -> (("checkpoint" -> r.partition.checkpointRoot) ~ ("operator" -> r.partition.operatorId) ~
      ("partition" -> r.partition.partitionId) ~ ("store" -> r.partition.storeName))) ~
      ("run" -> r.runId) ~ ("version" -> r.version) ~ ("family" -> r.family) ~ ("limit" -> r.limit) ~
      ("wait_ms" -> r.waitMs) ~ ("gets" -> JArray(r.gets.toList.map(b64))) ~
      ("prefixes" -> JArray(r.prefixes.toList.map(b64)))

  private def readOf(v: JValue): ViewRead = {
    val p = v \ "partition"
    ViewRead(StorePartition((p \ "checkpoint").extract[String], (p \ "operator").extract[Long],
      (p \ "partition").extract[Int], (p \ "store").extract[String]), (v \ "run").extract[String],
      (v \ "version").extract[Long], (v \ "family").extract[String],
      (v \ "gets").extract[List[JValue]].map(unb64), (v \ "prefixes").extract[List[JValue]].map(unb64),
      (v \ "limit").extract[Int], (v \ "wait_ms").extract[Long])
  }

  def answerJson(a: ViewAnswer): JValue =
    ("values" -> JArray(a.values.toList.map(b64))) ~
      ("scans" -> JArray(a.scans.toList.map { case (entries, more) =>
        ("entries" -> JArray(entries.toList.map { case (k, v) => JArray(List(b64(k), b64(v))) })) ~ ("more" -> more)
      }))

  def answerOf(v: JValue): ViewAnswer = ViewAnswer(
    (v \ "values").extract[List[JValue]].map(unb64),
    (v \ "scans").extract[List[JValue]].map { scan =>
      ((scan \ "entries").extract[List[List[JValue]]].map(e => unb64(e.head) -> unb64(e(1))),
        (scan \ "more").extract[Boolean])
    })

  /** One read, answered from this JVM's committed views (the proxy calls it directly when they are its own). */
  def read(r: ViewRead): ViewAnswer = {
    def notHeld = new Refused(404, VersionNotHeld, s"version ${r.version} of ${r.partition} (run ${r.runId}) " +
      "is not held here", CommittedViews.versions(r.partition, r.runId))
    try CommittedViews.read(r.partition, r.runId, r.version, r.waitMs) { view =>
      ViewAnswer(r.gets.map(view.get(r.family, _)), r.prefixes.map(view.prefixScan(r.family, _, r.limit)))
    }.getOrElse(throw notHeld) catch {
      // Released under the read (a newer commit, an unload): not held any more.
      case e: KeyedStateStateException if e.error == ErrorId.StoreClosed => throw notHeld
    }
  }
}
