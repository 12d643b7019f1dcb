package io.keyedstate.ttl

import java.nio.charset.StandardCharsets.UTF_8
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicBoolean

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.internal.Logging
import org.json4s._
import org.json4s.jackson.JsonMethods

import io.keyedstate.conf.TimeCharacteristic
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * The time of one micro-batch, as the query recorded it in its offset log before running it:
 * `batchTimestampMs` (processing time) and `batchWatermarkMs` (event time). `fromOffsetLog` is
 * false when no offset log entry exists (wall-clock fallback).
 */
final case class BatchTime(processingMs: Long, watermarkMs: Long, fromOffsetLog: Boolean) {
  def now(tc: TimeCharacteristic): Long = tc match {
    case TimeCharacteristic.ProcessingTime => processingMs
    case TimeCharacteristic.EventTime => watermarkMs
  }
}

/**
 * The deterministic clock of TTL. A store loaded at version `v` serves micro-batch `v`; its time
 * is read from `<checkpointRoot>/offsets/<v>`, so a replay of a failed batch (another attempt,
 * another executor) stamps and expires exactly as the first attempt did. The checkpoint root is
 * the parent of the state root (`<root>/state`). Entries are cached per (root, batch) per JVM:
 * every partition of a batch reads the same small file.
 */
object TtlClock extends Logging {
  private val cache = new ConcurrentHashMap[(String, Long), BatchTime]()
  private val MaxCached = 4096
  private val fallbackLogged = new AtomicBoolean(false)

  /** `stateRoot` is `StateStoreId.checkpointRootLocation`. */
  def at(stateRoot: String, batchId: Long, hadoopConf: Configuration): BatchTime = {
    val root = new Path(stateRoot).getParent
    if (root == null) return fallback(s"the state root $stateRoot has no parent, the checkpoint root holding offsets/")
    val cacheKey = (root.toString, batchId)
    val cached = cache.get(cacheKey)
    if (cached != null) return cached
    def entry(id: Long) = new Path(new Path(root, "offsets"), id.toString)
    read(entry(batchId), hadoopConf) match {
      case Some(t) =>
        if (cache.size() >= MaxCached) cache.clear()
        cache.put(cacheKey, t)
        t
      case None =>
        // No entry for this batch: a reader of the state after the last batch (Spark's state
        // data source reads version = last batch + 1) sees it as that batch left it. Not cached:
        // the entry may appear when the query plans the batch.
        def missing = fallback(s"no offset log entry for batch $batchId" +
          (if (batchId > 0) s" or ${batchId - 1}" else "") + s" in $root/offsets")
        if (batchId > 0) read(entry(batchId - 1), hadoopConf).getOrElse(missing)
        else missing
    }
  }

  /**
   * No offset log at all: the provider is driven directly (unit tests, tools), not by a query.
   * Processing time is the wall clock (not deterministic); the watermark is Spark's initial 0,
   * so event-time TTL expires nothing written at a later watermark.
   */
  private def fallback(why: => String): BatchTime = {
    // Once per JVM: a provider driven directly falls back for every batch of every partition.
    if (fallbackLogged.compareAndSet(false, true)) {
      logWarning(s"TTL falls back to the wall clock ($why): processing-time TTL is not deterministic " +
        "across a batch's attempts, event-time TTL sees watermark 0. Logged once per JVM.")
    }
    BatchTime(System.currentTimeMillis(), 0L, fromOffsetLog = false)
  }

  /** Spark's offset log entry: a version line (`v1`), then the metadata JSON, then one line per source. */
  private[ttl] def parse(text: String, path: String): BatchTime = {
    val lines = text.split("\n", 3)
    def bad(why: String): Nothing =
      throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid, s"Cannot read the batch time from offset log $path: $why")
    if (lines.length < 2 || !lines(0).startsWith("v")) bad("not an offset log entry")
    implicit val formats: Formats = DefaultFormats
    val json =
      try JsonMethods.parse(lines(1))
      catch { case NonFatal(e) => bad(s"metadata is not JSON (${e.getMessage})") }
    def long(field: String): Long = (json \ field) match {
      case JInt(v) => v.toLong
      case JLong(v) => v
      case _ => 0L // Spark omits neither; a missing field reads as the epoch, as in Spark's own default
    }
    BatchTime(long("batchTimestampMs"), long("batchWatermarkMs"), fromOffsetLog = true)
  }

  private def read(path: Path, hadoopConf: Configuration): Option[BatchTime] = {
    val fs = path.getFileSystem(hadoopConf)
    if (!exists(fs, path)) None
    else {
      val in = fs.open(path)
      val text = try new String(in.readAllBytes(), UTF_8) finally in.close()
      Some(parse(text, path.toString))
    }
  }

  private def exists(fs: FileSystem, path: Path): Boolean =
    try fs.exists(path)
    catch { case NonFatal(_) => false }
}
