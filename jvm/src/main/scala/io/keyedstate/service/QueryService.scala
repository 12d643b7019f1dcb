package io.keyedstate.service

import java.nio.charset.StandardCharsets.UTF_8
import java.util.{Collections, UUID, WeakHashMap}
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.sun.net.httpserver.HttpExchange
import org.apache.hadoop.fs.Path
import org.apache.spark.SparkContext
import org.apache.spark.internal.Logging
import org.apache.spark.scheduler.{SparkListener, SparkListenerApplicationEnd}
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.streaming.StreamingQueryListener
import org.apache.spark.sql.streaming.StreamingQueryListener.{QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent}
import org.json4s.{DefaultFormats, Formats, JArray, JBool, JObject, JString, JValue}
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.checkpoint.Transfers
import io.keyedstate.errors.{ErrorId, KeyedStateError}
import io.keyedstate.offline.SavepointMetadata
import io.keyedstate.queryable.{HttpServers, ListSlice, MapRange, QueryableState, StateLookups}
import io.keyedstate.shims.SparkTypes.{StreamExecution, StreamingQueryWrapper}

/**
 * The query service (docs/query-service.md): an HTTP server with JSON on the driver, one per
 * application, over the application's running streaming queries. Today it lists them and takes
 * savepoints of them in the application itself (Flink's REST trigger: `POST
 * /jobs/:id/savepoints`), where a savepoint yields to the query's batches; a tool given a running
 * query's checkpoint finds the service in this machine's [[ServiceRegistry]]. Every request
 * carries the application's bearer token. Requests are served on a small pool of their own
 * threads; a savepoint runs on one thread of its own, one at a time, while its request id
 * answers how it goes.
 */
final class QueryService private (sc: SparkContext, settings: ServiceSettings) extends Logging {
  import QueryService._

  private val savepointRunner = Transfers.daemonPool("keyedstate-service-savepoint", 1)
  private val queries = new ConcurrentHashMap[UUID, RunningQuery]()
  private val savepoints = new SavepointRequests(savepointRunner)
  private val lookups = new StateLookups(sc, settings.lookupsFromCheckpoint)
  // Started last: requests may come at once, and use every field above.
  private val server = HttpServers.start(settings.host, settings.port, "keyedstate-service", HandlerThreads)(serve)

  val url: String = s"http://${HttpServers.urlHost(settings.host)}:${server.port}"
  logInfo(s"keyedstate query service at $url")

  /**
   * Serves `query` (its latest run); this machine's registry names the service. Once the run
   * stops, its state stays queryable (read from its checkpoint) until another run of the query
   * starts or the application ends, and its entry says it stopped.
   */
  private[service] def register(query: StreamExecution): Unit = {
    Option(queries.put(query.id, RunningQuery(query))).filter(_.query.runId != query.runId)
      .foreach(before => forget(before.query.runId))
    publishEntry(query, stopped = false)
  }

  /**
   * The run of `id` stopped: a query with queryable states stays served (from its checkpoint);
   * any other goes, with its registry entry.
   */
  private[service] def stopped(id: UUID, runId: UUID): Unit =
    Option(queries.get(id)).filter(_.query.runId == runId).foreach { q =>
      if (statesOf(q.query).nonEmpty) publishEntry(q.query, stopped = true)
      else {
        queries.remove(id, q)
        forget(runId)
      }
    }

  /** Serves run `runId` no more: its states' catalog and its registry entry go. */
  private def forget(runId: UUID): Unit = {
    lookups.forget(runId)
    ServiceRegistry.withdraw(runId.toString)
  }

  /**
   * The queryable states of `query`, none when they cannot be learned (a query whose plan fails,
   * a checkpoint gone): one query's trouble never fails a request about another.
   */
  private def statesOf(query: StreamExecution, atOnce: Boolean = false): Seq[QueryableState] =
    try lookups.states(query, atOnce) catch {
      case StateLookups.WouldWait => throw StateLookups.WouldWait
      case NonFatal(e) =>
        logDebug(s"keyedstate query service: the queryable states of query ${query.id} are not known: ${e.getMessage}")
        Nil
    }

  private def publishEntry(query: StreamExecution, stopped: Boolean): Unit =
    ServiceRegistry.publish(ServiceEntry(url, settings.token, query.id.toString, query.runId.toString,
      query.resolvedCheckpointRoot, sc.applicationId, ProcessHandle.current().pid(), System.currentTimeMillis(),
      stopped))

  /** Stops serving, and withdraws the registry entries of the queries it still served. */
  private[service] def stop(): Unit = {
    server.stop()
    savepointRunner.shutdownNow()
    lookups.close()
    queries.values.asScala.foreach(q => ServiceRegistry.withdraw(q.query.runId.toString))
    queries.clear()
  }

  /**
   * On the server's dispatcher thread: a lookup that needs no wait (local mode's views, held at
   * the batch asked) is answered at once, since handing it to another thread costs more than the
   * lookup; everything else is answered on a handler thread.
   */
  private def serve(exchange: HttpExchange): Unit =
    (try dispatch(exchange) catch refusal(exchange)) match {
      case Now(response) => respond(exchange, response)
      case Later(work) => server.defer(respond(exchange, try work() catch refusal(exchange).andThen(_.response)))(
        respond(exchange, Response(503, error(ErrorId.ServiceUnavailable, "The query service is stopping"))))
    }

  private def dispatch(exchange: HttpExchange): Handling = {
    val lookupOf: Option[() => (StreamExecution, QueryableState)] =
      (exchange.getRequestMethod, pathOf(exchange)) match {
        case ("POST", List("v1", "state", name)) => Some(() => queryableState(name, None, atOnce = true))
        case ("POST", List("v1", "queries", id, "state", name)) =>
          Some(() => queryableState(name, Some(served(id)), atOnce = true))
        case _ => None
      }
    lookupOf match {
      case Some(find) =>
        authorize(exchange)
        try {
          val (query, state) = find()
          val body = readBody(exchange, MaxLookupBodyBytes)
          try Now(lookup(query, state, body, atOnce = true)) catch {
            case StateLookups.WouldWait => Later(() => lookup(query, state, body))
          }
        } catch {
          case StateLookups.WouldWait => Later(() => route(exchange)) // a query's states not known yet
        }
      case None => Later(() => route(exchange))
    }
  }

  /** A failed request's answer: a refusal's status and error id, or 500 (logged). */
  private def refusal(exchange: HttpExchange): PartialFunction[Throwable, Now] = {
    case e: ServiceRefusal => Now(Response(e.status, error(e.id, e.getMessage), e.allow))
    case e: StateLookups.LookupRefused => Now(Response(e.status, error(e.id, e.getMessage)))
    case NonFatal(e) =>
      logWarning(s"keyedstate query service: ${exchange.getRequestMethod} ${exchange.getRequestURI} failed", e)
      Now(Response(500, errorOf(e)))
  }

  /** Sends `response` (computed here: the exchange is closed whatever happens) and closes the exchange. */
  private def respond(exchange: HttpExchange, answer: => Response): Unit =
    try {
      val response = answer // evaluated once: it may do the request's work
      val body = JsonMethods.compact(JsonMethods.render(response.body)).getBytes(UTF_8)
      exchange.getResponseHeaders.set("Content-Type", "application/json; charset=utf-8")
      response.allow.foreach(a => exchange.getResponseHeaders.set("Allow", a))
      if (exchange.getRequestMethod == "HEAD") exchange.sendResponseHeaders(response.status, -1)
      else {
        exchange.sendResponseHeaders(response.status, body.length.toLong)
        exchange.getResponseBody.write(body)
      }
    } catch {
      case NonFatal(e) => logWarning(s"keyedstate query service: cannot answer ${exchange.getRequestURI}", e)
    } finally exchange.close()

  private def pathOf(exchange: HttpExchange): List[String] =
    exchange.getRequestURI.getPath.split("/").filter(_.nonEmpty).toList

  private def route(exchange: HttpExchange): Response = {
    authorize(exchange)
    val method = exchange.getRequestMethod
    pathOf(exchange) match {
      case List("v1", "queries") => only(method, "GET")(Response(200, "queries" -> queries.values.asScala.toList
        .filter(_.query.isActive).sortBy(_.query.id.toString).map(_.toJson)))
      case List("v1", "queries", id, "savepoints") => only(method, "POST") {
        val query = running(id)
        val body = readBody(exchange)
        val target = field(body, "target").getOrElse(throw badRequest("the body needs \"target\": the savepoint's folder"))
        // A relative path would be the driver's working directory's, which the client cannot know.
        if (!new Path(target).isUriPathAbsolute) {
          throw badRequest(s"Invalid target '$target': allowed is an absolute path or a URI (hdfs://..., s3a://...)")
        }
        val format = field(body, "format").getOrElse(SavepointMetadata.Native)
        if (!SavepointMetadata.Formats.contains(format)) {
          throw badRequest(s"Invalid savepoint format '$format': allowed are ${SavepointMetadata.Formats.mkString(", ")}")
        }
        Response(202, "request_id" -> savepoints.trigger(query, target, format))
      }
      case List("v1", "queries", id, "savepoints", requestId) => only(method, "GET") {
        queryId(id) // a request's status outlives its query (a query stopped once its savepoint was asked)
        Response(200, savepoints.status(id, requestId).getOrElse(throw new ServiceRefusal(404, ErrorId.ServiceNotFound,
          s"No savepoint request $requestId of query $id (the service keeps the last ${SavepointRequests.Kept})")))
      }
      case List("v1", "state") => only(method, "GET")(Response(200, "states" -> servedQueries.flatMap(q =>
        statesOf(q).map(stateJson(q, _)))))
      case List("v1", "state", name) => only(method, "POST") {
        val (query, state) = queryableState(name, None)
        lookup(query, state, readBody(exchange, MaxLookupBodyBytes))
      }
      case List("v1", "queries", id, "state") => only(method, "GET") {
        val query = served(id)
        Response(200, "states" -> statesOf(query).map(stateJson(query, _)))
      }
      case List("v1", "queries", id, "state", name) => only(method, "POST") {
        val (query, state) = queryableState(name, Some(served(id)))
        lookup(query, state, readBody(exchange, MaxLookupBodyBytes))
      }
      case _ => throw new ServiceRefusal(404, ErrorId.ServiceNotFound, s"No path ${exchange.getRequestURI.getPath}: " +
        "the service serves GET /v1/queries, POST /v1/queries/<id>/savepoints, GET " +
        "/v1/queries/<id>/savepoints/<request id>, GET /v1/state, POST /v1/state/<name>, " +
        "GET /v1/queries/<id>/state and POST /v1/queries/<id>/state/<name>")
    }
  }

  /** A queryable state as the listings show it: with its query and run, and whether that runs. */
  private def stateJson(query: StreamExecution, state: QueryableState): JValue =
    state.toJson merge JObject("query" -> JString(query.id.toString), "run" -> JString(query.runId.toString),
      "running" -> JBool(query.isActive))

  /** The queries whose state lookups read: the running ones, and the stopped ones (from their checkpoints). */
  private def servedQueries: List[StreamExecution] =
    queries.values.asScala.toList.map(_.query).sortBy(q => (!q.isActive, q.id.toString))

  /** State `name` of `query`, or of the one running query that has it. */
  private def queryableState(name: String, query: Option[StreamExecution], atOnce: Boolean = false)
      : (StreamExecution, QueryableState) = {
    val candidates = query.toList.flatMap(q => statesOf(q, atOnce).map(q -> _)) match {
      case Nil if query.isEmpty => servedQueries.flatMap(q => statesOf(q, atOnce).map(q -> _))
      case found => found
    }
    val named = candidates.filter(_._2.name == name)
    // Without a query id, a running query's state is preferred to a stopped one's.
    val preferred = if (query.isEmpty && named.exists(_._1.isActive)) named.filter(_._1.isActive) else named
    preferred match {
      case List(one) => one
      case Nil =>
        val known = candidates.map(_._2.name).distinct.sorted
        throw new ServiceRefusal(404, ErrorId.ServiceNotFound, s"No queryable state '$name' in " +
          query.fold(s"the queries of application ${sc.applicationId}")(q => s"query ${q.id}") +
          s" (queryable: ${if (known.isEmpty) "none; a state is made queryable with set_queryable(name), and is " +
            "known once its query planned a batch" else known.mkString(", ")})")
      case several if several.map(_._1.id).distinct.size == 1 => throw badRequest(s"Several states of query " +
        s"${several.head._1.id} are queryable as '$name' (of ${several.map(_._2.owner).mkString(", ")}): " +
        "give each its own name")
      case several => throw badRequest(s"Queryable state '$name' is in several queries " +
        s"(${several.map(_._1.id).mkString(", ")}): ask one, POST /v1/queries/<id>/state/$name")
    }
  }

  /** A lookup; `atOnce`: answered without waiting, or [[StateLookups.WouldWait]] is thrown. */
  private def lookup(query: StreamExecution, state: QueryableState, body: JValue, atOnce: Boolean = false)
      : Response = {
    val keys = body \ "keys" match {
      case JArray(items) if items.nonEmpty => items
      case _ => throw badRequest("The body needs \"keys\": a non-empty array of keys (a key of several columns is " +
        "an array of their values)")
    }
    val minBatch = optionalLong(body, "min_batch", 0L, Long.MaxValue)
    val timeoutMs = optionalLong(body, "timeout_ms", 1L, MaxLookupTimeoutMs).getOrElse(DefaultLookupTimeoutMs)
    val limit = optionalLong(body, "limit", 1L, MaxScanLimit).map(_.toInt).getOrElse(DefaultScanLimit)
    def present(name: String): Option[JValue] = body \ name match {
      case org.json4s.JNothing => None
      case v => Some(v)
    }
    val prefix = present("map_key_prefix").map {
      case org.json4s.JString(p) => p
      case other => throw badRequest(s"\"map_key_prefix\" must be a string, not ${JsonMethods.compact(other)}")
    }
    val range = (present("map_key_from"), present("map_key_to"), prefix) match {
      case (None, None, None) => None
      case (from, to, p) => Some(MapRange(from, to, p))
    }
    val index = Int.MaxValue.toLong
    val slice = (optionalLong(body, "start", -index, index), optionalLong(body, "stop", -index, index)) match {
      case (None, None) => None
      case (start, stop) => Some(ListSlice(start.map(_.toInt), stop.map(_.toInt)))
    }
    if (range.isDefined && slice.isDefined) {
      throw badRequest("\"start\"/\"stop\" read a list state, \"map_key_from\"/\"map_key_to\"/\"map_key_prefix\" a " +
        "map state: not both")
    }
    Response(200, lookups.get(query, state, keys, minBatch, timeoutMs, limit, present("map_key"), range.orElse(slice),
      atOnce))
  }

  private def authorize(exchange: HttpExchange): Unit = {
    if (!HttpServers.bearerIs(exchange, settings.token)) {
      throw new ServiceRefusal(401, ErrorId.ServiceUnauthorized, "The request has no bearer token or another than " +
        s"the service's (${ServiceSettings.TokenKey}, or the token in the query's entry in ${ServiceRegistry.folder})")
    }
  }

  private def queryId(id: String): UUID =
    try UUID.fromString(id) catch {
      case _: IllegalArgumentException => throw badRequest(s"Invalid query id '$id': allowed is a query's UUID")
    }

  /** The query `id`, running or stopped (its state is read from its checkpoint then). */
  private def served(id: String): StreamExecution = {
    val uuid = queryId(id)
    Option(queries.get(uuid)).map(_.query).getOrElse(throw new ServiceRefusal(404, ErrorId.ServiceNotFound,
      s"No query $id in application ${sc.applicationId} (known: " +
        s"${queries.keySet.asScala.toSeq.map(_.toString).sorted.mkString(", ")})"))
  }

  private def running(id: String): StreamExecution = {
    val uuid = queryId(id)
    Option(queries.get(uuid)).map(_.query).filter(_.isActive).getOrElse(throw new ServiceRefusal(404,
      ErrorId.ServiceNotFound, s"No running query $id in application ${sc.applicationId} (running: " +
        s"${queries.values.asScala.toSeq.filter(_.query.isActive).map(_.query.id.toString).sorted.mkString(", ")})"))
  }
}

object QueryService extends Logging {
  private implicit val jsonFormats: Formats = DefaultFormats
  // Lookups may wait for a batch (min_batch): enough threads that a few waiting leave others free.
  private val HandlerThreads = 16
  private val MaxBodyBytes = 64 * 1024

  private val services = Collections.synchronizedMap(new WeakHashMap[SparkContext, Option[QueryService]]())
  private val listening = Collections.synchronizedMap(new WeakHashMap[SparkSession, java.lang.Boolean]())

  /** The service of `sc`, if it runs. */
  def of(sc: SparkContext): Option[QueryService] = Option(services.get(sc)).flatten

  /**
   * Starts the application's service if it is enabled and not started, and serves `session`'s
   * queries; called where a streaming query is analysed (as [[io.keyedstate.QueryLeaseListener]]
   * is installed). A bad setting fails the query's start; an address that cannot be bound is logged
   * and the queries run without the service.
   */
  def installOn(session: SparkSession): Unit =
    if (session.sparkContext.getLocalProperty(StreamExecution.QUERY_ID_KEY) == null) {
      val sc = session.sparkContext
      val service = services.synchronized {
        if (!services.containsKey(sc)) services.put(sc, start(sc))
        services.get(sc)
      }
      service.foreach { s =>
        if (listening.putIfAbsent(session, java.lang.Boolean.TRUE) == null) session.streams.addListener(new Listener(session, s))
      }
    }

  private def start(sc: SparkContext): Option[QueryService] = {
    val settings = ServiceSettings.from(sc.getConf)
    if (!settings.enabled) None
    else try {
      val service = new QueryService(sc, settings)
      sc.addSparkListener(new SparkListener {
        override def onApplicationEnd(end: SparkListenerApplicationEnd): Unit = {
          services.remove(sc) // a stopped context's service must not keep it (nor be found)
          service.stop()
        }
      })
      // A JVM that exits without stopping its context still withdraws its registry entries.
      sys.addShutdownHook(service.stop())
      Some(service)
    } catch {
      case NonFatal(e) =>
        logWarning(s"keyedstate query service: cannot listen on ${settings.host}:${settings.port} " +
          s"(${e.getMessage}); queries run without it", e)
        None
    }
  }

  /** Registers each query of `session` with the service while it runs; the registry's writes run off Spark's listener bus. */
  private final class Listener(session: SparkSession, service: QueryService) extends StreamingQueryListener {
    override def onQueryStarted(event: QueryStartedEvent): Unit =
      Option(session.streams.get(event.id)).collect { case w: StreamingQueryWrapper => w.streamingQuery }
        .filter(_.runId == event.runId)
        .foreach(q => background(s"register query ${event.id}")(service.register(q)))

    override def onQueryProgress(event: QueryProgressEvent): Unit = ()

    override def onQueryTerminated(event: QueryTerminatedEvent): Unit =
      background(s"mark query ${event.id} stopped")(service.stopped(event.id, event.runId))
  }

  private val registrations = Transfers.daemonPool("keyedstate-service-registry", 1)

  private def background(what: String)(f: => Unit): Unit = registrations.execute { () =>
    try f catch { case NonFatal(e) => logWarning(s"keyedstate query service: cannot $what: ${e.getMessage}", e) }
  }

  private final case class Response(status: Int, body: JValue, allow: Option[String] = None)

  /** What the dispatcher thread does with a request: answer it now, or have a handler thread do `work`. */
  private sealed trait Handling
  private final case class Now(response: Response) extends Handling
  private final case class Later(work: () => Response) extends Handling

  /** A request the service refuses, with its HTTP status (and, for a method it does not serve, the allowed one). */
  private final class ServiceRefusal(val status: Int, val id: ErrorId, message: String,
      val allow: Option[String] = None) extends Exception(message)

  private def badRequest(message: String) = new ServiceRefusal(400, ErrorId.ServiceBadRequest, message)

  private def only(method: String, allowed: String)(response: => Response): Response =
    if (method == allowed || (method == "HEAD" && allowed == "GET")) response
    else throw new ServiceRefusal(405, ErrorId.ServiceBadRequest,
      s"Method $method is not served on this path: allowed is $allowed", Some(allowed))

  private val MaxLookupBodyBytes = 4 * 1024 * 1024
  private val DefaultLookupTimeoutMs = 10000L
  private val DefaultScanLimit = 10000
  // A scan holds its snapshot (and answers) in memory; a wait holds a request thread.
  private val MaxScanLimit = 100000L
  private val MaxLookupTimeoutMs = 60000L

  private def readBody(exchange: HttpExchange, maxBytes: Int = MaxBodyBytes): JValue = {
    val bytes = exchange.getRequestBody.readNBytes(maxBytes + 1)
    if (bytes.length > maxBytes) throw badRequest(s"The body has more than $maxBytes bytes")
    try JsonMethods.parse(new String(bytes, UTF_8)) catch {
      case NonFatal(e) => throw badRequest(s"The body is not JSON: ${e.getMessage.linesIterator.nextOption().getOrElse("")}")
    }
  }

  private def field(body: JValue, name: String): Option[String] = body match {
    case o: JObject => (o \ name) match {
      case org.json4s.JNothing | org.json4s.JNull => None
      case org.json4s.JString(s) if s.trim.nonEmpty => Some(s.trim)
      case other => throw badRequest(s"\"$name\" must be a non-empty string, not ${JsonMethods.compact(other)}")
    }
    case _ => throw badRequest("The body must be a JSON object")
  }

  /** An optional integer field, from `min` to `max`. */
  private def optionalLong(body: JValue, name: String, min: Long, max: Long): Option[Long] = (body \ name) match {
    case org.json4s.JNothing | org.json4s.JNull => None
    case org.json4s.JInt(i) if i >= min && i <= max => Some(i.toLong)
    case org.json4s.JLong(i) if i >= min && i <= max => Some(i)
    case other => throw badRequest(s"\"$name\" must be an integer from $min to $max, not ${JsonMethods.compact(other)}")
  }

  private[service] def error(id: ErrorId, message: String): JValue =
    ("error_id" -> id.name) ~ ("message" -> message)

  /** The error of a failure: keyedstate's identifier when it carries one (in its causes), its first line. */
  private[service] def errorOf(e: Throwable): JValue = {
    val ours = Iterator.iterate(e)(_.getCause).takeWhile(_ != null).collectFirst { case k: KeyedStateError => k }
    val message = Option(ours.getOrElse(e).getMessage).getOrElse(e.getClass.getName).linesIterator.nextOption()
      .getOrElse("")
    ("error_id" -> ours.map(_.errorId)) ~ ("message" -> message)
  }

  private final case class RunningQuery(query: StreamExecution) {
    def toJson: JValue =
      ("id" -> query.id.toString) ~ ("run_id" -> query.runId.toString) ~ ("name" -> Option(query.name)) ~
        ("checkpoint" -> query.resolvedCheckpointRoot) ~
        ("last_committed_batch" -> query.commitLog.getLatestBatchId().map(Long.box).map(_.longValue)) ~
        ("trigger_active" -> query.status.isTriggerActive)
  }
}
