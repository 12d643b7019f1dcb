package io.keyedstate.queryable

import java.net.InetSocketAddress
import java.nio.charset.StandardCharsets.UTF_8
import java.security.MessageDigest
import java.util.Base64

import scala.util.control.NonFatal

import com.sun.net.httpserver.{HttpExchange, HttpServer}
import org.json4s._
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.{CommittedViews, StorePartition}
import io.keyedstate.checkpoint.Transfers
import io.keyedstate.errors.{ErrorId, KeyedStateStateException}

/**
 * The state server of one executor (Flink's `KvStateServer`): answers the driver's lookups
 * from the committed views this JVM holds ([[CommittedViews]]), in stored bytes. It never writes,
 * and reads only the exact version a request names, so an answer is always one committed
 * batch's state. The protocol is internal (docs/queryable-state.md, "Architecture"): the
 * driver's proxy is its only client, with the application's internal token.
 *
 * `POST /internal/v1/read` with `{"partition": {...}, "version", "wait_ms", "family",
 * "gets": [base64 key], "prefixes": [base64 prefix], "limit"}` answers `{"version", "values":
 * [base64 or null], "scans": [{"entries": [[key, value]], "more"}]}`, or 404 with the versions
 * held when the version is not.
 */
final class StateServer(host: String, token: String) extends AutoCloseable {
  import StateServer._

  private val server = HttpServer.create(new InetSocketAddress(host, 0), 0)
  private val handlers = Transfers.daemonPool("keyedstate-state-server", HandlerThreads)
  server.createContext("/", (exchange: HttpExchange) => serve(exchange))
  server.setExecutor(handlers)
  private val starter = new Thread(() => server.start(), "keyedstate-state-server-start")
  starter.setDaemon(true) // the dispatcher thread takes its daemon flag from its starter
  starter.start()
  starter.join()

  val url: String = s"http://${if (host.contains(":")) s"[$host]" else host}:${server.getAddress.getPort}"

  override def close(): Unit = {
    server.stop(0)
    handlers.shutdownNow()
  }

  private def serve(exchange: HttpExchange): Unit =
    try {
      val (status, body) =
        try route(exchange) catch {
          case e: Refused => (e.status, ("error" -> e.kind) ~ ("message" -> e.getMessage) ~ ("versions" -> e.versions))
          case NonFatal(e) =>
            logger.warn(s"keyedstate state server: ${exchange.getRequestURI} failed", e)
            (500, ("error" -> "failed") ~ ("message" -> String.valueOf(e.getMessage)))
        }
      val bytes = JsonMethods.compact(JsonMethods.render(body)).getBytes(UTF_8)
      exchange.getResponseHeaders.set("Content-Type", "application/json")
      exchange.sendResponseHeaders(status, bytes.length.toLong)
      exchange.getResponseBody.write(bytes)
    } catch {
      case NonFatal(e) => logger.warn(s"keyedstate state server: cannot answer ${exchange.getRequestURI}", e)
    } finally exchange.close()

  private def route(exchange: HttpExchange): (Int, JValue) = {
    val presented = Option(exchange.getRequestHeaders.getFirst("Authorization")).map(_.stripPrefix("Bearer ").trim)
      .getOrElse("")
    if (!MessageDigest.isEqual(presented.getBytes(UTF_8), token.getBytes(UTF_8))) {
      throw new Refused(401, "unauthorized", "no internal token, or another", Nil)
    }
    if (exchange.getRequestMethod != "POST" || exchange.getRequestURI.getPath != ReadPath) {
      throw new Refused(404, "not_found", s"no ${exchange.getRequestMethod} ${exchange.getRequestURI.getPath}", Nil)
    }
    val request = JsonMethods.parse(new String(exchange.getRequestBody.readAllBytes(), UTF_8))
    (200, read(request))
  }
}

object StateServer {
  implicit private val formats: Formats = DefaultFormats
  private val logger = org.slf4j.LoggerFactory.getLogger(classOf[StateServer])
  private val HandlerThreads = 4
  val ReadPath = "/internal/v1/read"

  /** A read the server does not serve, with the versions it holds of the partition. */
  final class Refused(val status: Int, val kind: String, message: String, val versions: Seq[Long])
      extends Exception(message)

  private def b64(bytes: Array[Byte]): JValue = JString(Base64.getEncoder.encodeToString(bytes))
  private def unb64(v: JValue): Array[Byte] = Base64.getDecoder.decode(v.extract[String])

  def partitionJson(p: StorePartition): JValue =
    ("checkpoint" -> p.checkpointRoot) ~ ("operator" -> p.operatorId) ~ ("partition" -> p.partitionId) ~
      ("store" -> p.storeName)

  def partitionOf(v: JValue): StorePartition = StorePartition((v \ "checkpoint").extract[String],
    (v \ "operator").extract[Long], (v \ "partition").extract[Int], (v \ "store").extract[String])

  /** One read request, answered from this JVM's committed views. */
  def read(request: JValue): JValue = {
    val partition = partitionOf(request \ "partition")
    val version = (request \ "version").extract[Long]
    val cf = (request \ "family").extract[String]
    val gets = (request \ "gets").extractOpt[List[JValue]].getOrElse(Nil).map(unb64)
    val prefixes = (request \ "prefixes").extractOpt[List[JValue]].getOrElse(Nil).map(unb64)
    val limit = (request \ "limit").extractOpt[Int].getOrElse(10000)
    val waitMs = (request \ "wait_ms").extractOpt[Long].getOrElse(0L)
    def notHeld = new Refused(404, "version_not_held", s"version $version of $partition is not held here",
      CommittedViews.versions(partition))
    try CommittedViews.read(partition, version, waitMs) { view =>
      ("version" -> view.version) ~
        ("values" -> JArray(gets.map(k => Option(view.get(cf, k)).map(b64).getOrElse(JNull)))) ~
        ("scans" -> JArray(prefixes.map { p =>
          val (entries, more) = view.prefixScan(cf, p, limit)
          ("entries" -> JArray(entries.toList.map { case (k, v) => JArray(List(b64(k), b64(v))) })) ~ ("more" -> more)
        }))
    }.getOrElse(throw notHeld) catch {
      // Released under the read (a newer commit, an unload): not held any more.
      case e: KeyedStateStateException if e.errorId == ErrorId.StoreClosed.name => throw notHeld
    }
  }
}
