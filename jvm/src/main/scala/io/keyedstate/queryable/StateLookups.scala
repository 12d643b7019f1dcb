package io.keyedstate.queryable

import java.net.URI
import java.net.http.{HttpClient, HttpRequest, HttpResponse}
import java.nio.charset.StandardCharsets.UTF_8
import java.time.Duration
import java.util.UUID
import java.util.concurrent.{CompletableFuture, CompletionException, ConcurrentHashMap}

import scala.util.control.NonFatal

import org.apache.spark.SparkContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.InterpretedOrdering
import org.apache.spark.sql.types.StringType
import org.apache.spark.unsafe.types.UTF8String
import org.json4s._
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.CommittedViews
import io.keyedstate.errors.ErrorId
import io.keyedstate.shims.SparkTypes.StreamExecution

/**
 * The driver's proxy for lookups of queryable state (Flink's `KvStateClientProxy`): finds the
 * partition of each key with the query's own hash, the executor whose state server holds that
 * partition's committed views, asks it for the version of the query's last committed batch
 * (or waits for a batch a request names), and decodes the stored values. `fromCheckpoint`: every
 * partition is read from the checkpoint ([[CheckpointViews]]), none from the executors.
 */
final class StateLookups(sc: SparkContext, fromCheckpoint: Boolean = false) {
  import StateLookups._

  private val http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
    .connectTimeout(Duration.ofSeconds(5)).build()
  // The queryable states of each query run, read off its plan once it has one.
  private val catalogs = new ConcurrentHashMap[UUID, Seq[QueryableState]]()
  // Partitions no state server holds, read from their checkpoint.
  private val checkpoints = new CheckpointViews

  /**
   * The queryable states of `query`'s run (none before its first batch is planned); `atOnce`:
   * only if known already ([[StateLookups.WouldWait]] otherwise: learning them reads files).
   */
  def states(query: StreamExecution, atOnce: Boolean = false): Seq[QueryableState] = {
    val known = catalogs.get(query.runId)
    if (known != null) known
    else if (atOnce) throw WouldWait
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
   * `minBatch`: `{"batch", "values": [...]}`, values in `keys`' order. `part` reads a part of
   * each key's map (entries by map key) or list (elements by index). `atOnce`: the lookup is
   * answered only if that needs no wait (the views of this JVM hold the batch, the commit log's
   * last batch is known), and throws [[StateLookups.WouldWait]] otherwise, to be asked again
   * where it may wait.
   */
  def get(query: StreamExecution, state: QueryableState, keys: Seq[JValue], minBatch: Option[Long],
      timeoutMs: Long, limit: Int, mapKey: Option[JValue] = None, part: Option[Part] = None,
      atOnce: Boolean = false): JValue = {
    val deadline = System.nanoTime() + timeoutMs * 1000000L
    val rows = keys.zipWithIndex.map { case (k, i) => keyRow(state, k, s"key #$i") }
    // A map state's whole map per key (a scan of its entries), or the value of one map key.
    val entry = mapKey.map(m => internalMapKey(state, m, "map_key", "reads one entry of a map state"))
    val range = part.collect { case r: MapRange =>
      if (entry.isDefined) throw badRequest("\"map_key\" reads one entry; a range of entries is read without it")
      if (state.pickled.mapKey) {
        throw badRequest(s"'${state.name}' has pickled map keys, which have no order: read the whole map")
      }
      Bounds(r.from.map(internalMapKey(state, _, "map_key_from", "reads a range of a map state's entries")),
        r.to.map(internalMapKey(state, _, "map_key_to", "reads a range of a map state's entries")),
        r.prefix.map { p =>
          if (!state.mapKeyType.contains(StringType) || state.answer != Answer.Entries) {
            throw badRequest(s"\"map_key_prefix\" reads the entries of a map state with string keys; " +
              s"'${state.name}' is ${state.kind} state${state.mapKeyType.fold("")(t => s" keyed by ${t.simpleString}")}")
          }
          UTF8String.fromString(p)
        }, state.mapKeyType.map(t => InterpretedOrdering.forSchema(Seq(t))).orNull)
    }
    val slice = part.collect { case s: ListSlice =>
      if (state.answer != Answer.Elements) {
        throw badRequest(s"\"start\" and \"stop\" read elements of a list state; '${state.name}' is ${state.kind} state")
      }
      s
    }
    val located = state.withCodec(c => rows.map(r => entry.fold(c.locate(r))(c.locateEntry(r, _))))
    if (atOnce && range.isDefined) throw WouldWait // a range reads up to MaxEntriesInRange entries per key
    val batch = committedBatch(query, minBatch, deadline, atOnce)
    // A range is chosen among all of a map's entries: read them all (up to a bound).
    val scanLimit = if (range.isDefined) MaxEntriesInRange else limit
    val scan = state.answer == Answer.Entries && entry.isEmpty
    val (read, behind) =
      if (atOnce) (readHeldHere(query, state, located, batch + 1, scanLimit, scan), Nil)
      else readVersion(query, state, located, batch + 1, deadline, scanLimit, scan)
    minBatch.foreach { m =>
      behind.find(_.batch < m).foreach { b => throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
        s"batch $m of partition ${b.partition} cannot be read: ${b.reason}") }
    }
    val values = state.withCodec { c =>
      read.zipWithIndex.map {
        case (Left(bytes), _) if entry.isDefined => c.entryValueJson(bytes)
        case (Left(bytes), _) => slice.fold(c.valueJson(bytes))(s => sliced(c.valueJson(bytes), s))
        case (Right((entries, _)), _) if entries.isEmpty => JNull // no state, as for the other kinds
        case (Right((entries, more)), i) => range match {
          case None =>
            ("entries" -> JArray(entries.toList.map { case (k, v) => c.entryJson(k, v) })) ~ ("more" -> more)
          case Some(bounds) =>
            if (more) throw badRequest(s"the map of key #$i holds more than $MaxEntriesInRange entries: a range " +
              "is chosen among all of them; read it whole with \"limit\" instead")
            val within = entries.map { case (k, v) => (c.entryMapKey(k), k, v) }
              .filter { case (m, _, _) => bounds.holds(m) }.sortBy(_._1)(bounds.ordering)
            ("entries" -> JArray(within.take(limit).toList.map { case (_, k, v) => c.entryJson(k, v) })) ~
              ("more" -> (within.size > limit))
        }
      }
    }
    ("query" -> query.id.toString) ~ ("run" -> query.runId.toString) ~ ("name" -> state.name) ~ ("kind" -> state.kind) ~
      ("batch" -> batch) ~ ("values" -> JArray(values.toList)) ~
      ("behind" -> JArray(behind.toList.map(b => ("partition" -> b.partition) ~ ("batch" -> b.batch) ~
        ("reason" -> b.reason))))
  }

  /** A request's map key (`field`) as the map state's key type holds it. */
  private def internalMapKey(state: QueryableState, value: JValue, field: String, reads: String): Any = {
    val keyType = state.mapKeyType.filter(_ => state.answer == Answer.Entries).getOrElse(
      throw badRequest(s"\"$field\" $reads; '${state.name}' is ${state.kind} state"))
    try JsonValues.toInternal(value, keyType, field) catch {
      case e: JsonValues.BadValue => throw badRequest(e.getMessage)
    }
  }

  /** A list's elements `s.start` to `s.stop`, as Python slices them. */
  private def sliced(elements: JValue, s: ListSlice): JValue = elements match {
    case JArray(items) =>
      def at(i: Int) = if (i < 0) math.max(0, items.size + i) else math.min(i, items.size)
      JArray(items.slice(s.start.fold(0)(at), s.stop.fold(items.size)(at)))
    case other => other
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
  private def committedBatch(query: StreamExecution, minBatch: Option[Long], deadline: Long, atOnce: Boolean): Long = {
    var last = latestBatch(query, atOnce)
    if (atOnce && minBatch.exists(m => last.forall(_ < m))) throw WouldWait
    while (minBatch.exists(m => last.forall(_ < m)) && query.isActive && System.nanoTime() < deadline) {
      Thread.sleep(5)
      last = latestBatch(query)
    }
    def notReached(m: Long, why: String) = new LookupRefused(504, ErrorId.ServiceBatchNotReached,
      if (query.isActive) s"query ${query.id} did not commit batch $m within the request's timeout: $why"
      else s"query ${query.id} stopped before batch $m: $why")
    (last, minBatch) match {
      case (Some(b), Some(m)) if b < m => throw notReached(m, s"its last committed batch is $b")
      case (None, Some(m)) => throw notReached(m, "it has committed no batch yet")
      case (None, None) => throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
        s"query ${query.id} has committed no batch yet: its state is queryable from its first committed batch on")
      case (Some(b), _) => b
    }
  }

  // The commit log's last batch per query run, read at most once per LatestBatchCacheMs: the log's
  // folder is listed once, then only the next batch's entry is looked for (a listing of a folder
  // of a hundred entries costs more than many lookups, and lookups come by the thousand).
  private val latest = new ConcurrentHashMap[UUID, (Long, Option[Long])]()

  private def latestBatch(query: StreamExecution, atOnce: Boolean = false): Option[Long] = {
    val now = System.nanoTime()
    val cached = latest.get(query.runId)
    if (cached != null && now - cached._1 < LatestBatchCacheMs * 1000000L) cached._2
    else if (atOnce) throw WouldWait // reads the file system
    else {
      // A few batches behind: their entries are looked for; more (an idle spell): listed again.
      val stepped = Option(cached).flatMap(_._2).flatMap { known =>
        val ahead = Iterator.from(1).take(MaxSteps + 1).takeWhile(n => query.commitLog.get(known + n).isDefined).size
        if (ahead > MaxSteps) None else Some(known + ahead)
      }
      val found = stepped.orElse(query.commitLog.getLatestBatchId())
      // Two threads may read at once: the later batch wins, and no answer goes back in time.
      latest.merge(query.runId, (now, found), (a, b) => if (b._2.getOrElse(-1L) >= a._2.getOrElse(-1L)) b else a)._2
    }
  }

  /**
   * Each located key's stored value (or, to `scan`, its entries: a map state's) at `version`
   * of the query's run, asked of the servers holding their partitions, one read per partition,
   * all at once (a server in this JVM, local mode's, is read directly). A partition no server
   * holds at `version` (none holds it, its server does not answer, or holds other versions) is
   * read from the checkpoint, and is [[Behind]] when only an older version of it can be read.
   */
  private def readVersion(query: StreamExecution, state: QueryableState, located: Seq[(Int, Array[Byte])],
      version: Long, deadline: Long, limit: Int, scan: Boolean): (Seq[Read], Seq[Behind]) = {
    lazy val token = StateServers.token(sc).getOrElse(throw new LookupRefused(503, ErrorId.ServiceStateUnavailable,
      s"queryable state needs keyedstate's Spark plugin: start the application with spark.plugins=" +
        s"${QueryablePlugin.ClassName} (keyedstate.configure sets it)"))
    val runId = query.runId.toString
    def waitMs = math.max(0L, math.min(ServerWaitMs, (deadline - System.nanoTime()) / 1000000L))
    val byPartition = located.zipWithIndex.groupBy(_._1._1).toSeq
    val reads = byPartition.map { case (p, keys) =>
      val read = viewRead(state, p, runId, version, keys.map(_._1._2), scan, limit, waitMs)
      // A stopped query's views go as its executors unload them: its checkpoint serves it.
      val holder = if (query.isActive && !fromCheckpoint) StateServers.holder(read.partition, runId) else None
      val answer: CompletableFuture[Either[Throwable, (ViewAnswer, Option[Behind])]] = holder match {
        case None => fromCheckpointOf(query, read, deadline, async = byPartition.size > 1)
        case Some((executor, url)) =>
          val served =
            if (executor != LocalExecutorId) remoteRead(url, token, read, deadline)
            else if (byPartition.size == 1) CompletableFuture.completedFuture(localRead(read)) // no thread handoff
            else CompletableFuture.supplyAsync(() => localRead(read.copy(waitMs = waitMs)))
          served.thenCompose[Either[Throwable, (ViewAnswer, Option[Behind])]] {
            case Right(a) => CompletableFuture.completedFuture(Right((a, None)))
            case Left(e: StateServer.Refused) if e.kind == StateServer.VersionNotHeld =>
              fromCheckpointOf(query, read, deadline, async = true)
            case Left(_: Unreachable) => fromCheckpointOf(query, read, deadline, async = true)
            case Left(e) => CompletableFuture.completedFuture(Left(new IllegalStateException(
              s"the state server at $url failed to read ${read.partition}: ${e.getMessage}", e))) // 500, logged
          }
      }
      (keys.map(_._2), read, answer)
    }
    val out = new Array[Read](located.length)
    val behind = reads.flatMap { case (indices, _, future) =>
      val (answer, late) = future.join().fold(e => throw e, identity)
      fill(out, indices, answer, scan)
      late
    }
    (out.toSeq, behind.sortBy(_.partition))
  }

  /**
   * [[readVersion]] of partitions whose views this JVM holds at `version` (local mode's
   * executor), read on the calling thread; [[WouldWait]] if one is not held here.
   */
  private def readHeldHere(query: StreamExecution, state: QueryableState, located: Seq[(Int, Array[Byte])],
      version: Long, limit: Int, scan: Boolean): Seq[Read] = {
    val runId = query.runId.toString
    if (fromCheckpoint || !query.isActive || located.size.toLong * (if (scan) limit else 1) > StateServer.InlineEntries) {
      throw WouldWait
    }
    val out = new Array[Read](located.length)
    located.zipWithIndex.groupBy(_._1._1).foreach { case (p, keys) =>
      val partition = state.partition(p)
      if (!CommittedViews.readyAt(partition, runId, version, state.column)) throw WouldWait
      val read = viewRead(state, p, runId, version, keys.map(_._1._2), scan, limit, waitMs = 0)
      // Released meanwhile (a newer commit): asked again where it may wait.
      val answer = try StateServer.read(read) catch { case _: StateServer.Refused => throw WouldWait }
      fill(out, keys.map(_._2), answer, scan)
    }
    out.toSeq
  }

  /** One partition's read: point reads of `keys`, or to `scan`, scans of their prefixes. */
  private def viewRead(state: QueryableState, p: Int, runId: String, version: Long, keys: Seq[Array[Byte]],
      scan: Boolean, limit: Int, waitMs: Long): ViewRead =
    ViewRead(state.partition(p), runId, version, state.column, if (scan) Nil else keys, if (scan) keys else Nil,
      limit, waitMs)

  private def fill(out: Array[Read], indices: Seq[Int], answer: ViewAnswer, scan: Boolean): Unit =
    if (scan) indices.zip(answer.scans).foreach { case (i, entries) => out(i) = Right(entries) }
    else indices.zip(answer.values).foreach { case (i, v) => out(i) = Left(v) }

  /**
   * `read` answered from the query's committed checkpoint (no state server holds its version):
   * on the calling thread, or `async` on the checkpoint reader's own.
   */
  private def fromCheckpointOf(query: StreamExecution, read: ViewRead, deadline: Long, async: Boolean)
      : CompletableFuture[Either[Throwable, (ViewAnswer, Option[Behind])]] = {
    val root = query.resolvedCheckpointRoot
    val settings = () => (query.sparkSession.sessionState.conf, query.sparkSession.sessionState.newHadoopConf())
    def served(s: CheckpointViews.Served) =
      (s.answer, s.problem.map(Behind(read.partition.partitionId, s.version - 1, _)))
    def refused(e: Throwable) = new LookupRefused(503, ErrorId.ServiceStateUnavailable,
      String.valueOf(Option(e.getCause).filter(_ => e.isInstanceOf[CompletionException]).getOrElse(e).getMessage))
    if (!async) CompletableFuture.completedFuture(
      try Right(served(checkpoints.read(root, settings, read, deadline)))
      catch { case NonFatal(e) => Left(refused(e)) })
    else checkpoints.readAsync(root, settings, read, deadline).handle { (s, failure) =>
      if (failure != null) Left(refused(failure)) else Right(served(s))
    }
  }

  /** Stops reading the checkpoint: its local copies are closed and dropped. */
  def close(): Unit = checkpoints.close()

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

/** A part of each key's state a lookup reads. */
sealed trait Part

/** A map state's entries whose map keys are from `from` (inclusive) to `to` (exclusive), or start with `prefix`. */
final case class MapRange(from: Option[JValue], to: Option[JValue], prefix: Option[String]) extends Part

/** A list state's elements from `start` to `stop`, as Python slices a list (negative: from the end). */
final case class ListSlice(start: Option[Int], stop: Option[Int]) extends Part

/** A [[MapRange]] in the map key's type: whether a map key lies in it, and the map keys' order. */
private final case class Bounds(from: Option[Any], to: Option[Any], prefix: Option[UTF8String],
    keyOrdering: Ordering[InternalRow]) {
  val ordering: Ordering[Any] = (a: Any, b: Any) => keyOrdering.compare(InternalRow(a), InternalRow(b))
  def holds(key: Any): Boolean =
    from.forall(ordering.lteq(_, key)) && to.forall(ordering.lt(key, _)) &&
      prefix.forall(p => key.asInstanceOf[UTF8String].startsWith(p))
}

object StateLookups {
  implicit private val formats: Formats = DefaultFormats
  /** How long a state server waits for a version being committed. */
  private val ServerWaitMs = 2000L
  /** Local mode's one executor, in the driver's JVM (Spark's `SparkContext.DRIVER_IDENTIFIER`). */
  private val LocalExecutorId = "driver"
  /** Commit-log entries looked for one by one before the log is listed again. */
  private val MaxSteps = 4
  /** How long the last committed batch read off the commit log is trusted (bounds freshness). */
  private val LatestBatchCacheMs = 10L

  /** A state server that did not answer (connection refused or lost, timed out). */
  private final class Unreachable(message: String) extends Exception(message)

  /** The most entries of one key's map a range read chooses from. */
  val MaxEntriesInRange = 100000

  private def badRequest(message: String) = new LookupRefused(400, ErrorId.ServiceBadRequest, message)

  /** A stored value, or a map's entries and whether more follow. */
  private type Read = Either[Array[Byte], (Seq[(Array[Byte], Array[Byte])], Boolean)]

  /** A partition read at an older batch than asked, because the newer one cannot be read (the reason). */
  final case class Behind(partition: Int, batch: Long, reason: String)

  /** A lookup asked to be answered at once that would have to wait: ask again where it may. */
  object WouldWait extends Exception("the lookup would wait", null, false, false)

  /** A lookup refused, with the HTTP status and error id the service answers. */
  final class LookupRefused(val status: Int, val id: ErrorId, message: String) extends Exception(message)
}
