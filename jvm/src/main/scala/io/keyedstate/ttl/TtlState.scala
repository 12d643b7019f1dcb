package io.keyedstate.ttl

import java.util.concurrent.ConcurrentHashMap

import io.keyedstate.conf.TtlConfig
import io.keyedstate.rocks.TtlValueCodec

/**
 * What TTL means for the reads and writes of one loaded instance: the stamp a write gets, and
 * whether a stored entry is visible, hidden (expired, `NeverReturnExpired`) or refreshed by a
 * read (`OnReadAndWrite`). Removing expired entries is [[TtlCleanup]]'s job.
 *
 * `rewrite` stores a refreshed value (a put through the instance, so it reaches the changelog).
 */
final class TtlState(configOf: String => TtlConfig, rewrite: (String, Array[Byte], Array[Byte]) => Unit) {

  private val configs = new ConcurrentHashMap[String, TtlConfig]()

  /** The resolved TTL of a column family (cached: the options do not change while loaded). */
  def config(cf: String): TtlConfig = configs.computeIfAbsent(cf, c => configOf(c))

  // The time of the batch being served: set when a store opens, read lazily (a store that only
  // reads with TTL off never needs it). Volatile: background cleanup reads the last one.
  @volatile private var timeSource: () => BatchTime = () => throw new IllegalStateException("no batch started")
  @volatile private var time: BatchTime = _
  @volatile private var lastKnown: BatchTime = _

  // Counted from the task thread and, under Spark's pipelined Python runner, a keyed function's
  // lookup thread (hidden expired entries): the lock keeps both threads' counts.
  private var _stats = TtlStats()
  def stats: TtlStats = synchronized(_stats)
  private[ttl] def record(f: TtlStats => TtlStats): Unit = synchronized { _stats = f(_stats) }

  /** A store opened on the instance for a batch: its clock, and fresh counters. */
  def beginBatch(batchTime: () => BatchTime): Unit = {
    time = null
    timeSource = batchTime
    synchronized { _stats = TtlStats() }
  }

  def batchTime: BatchTime = {
    var t = time
    if (t == null) {
      t = timeSource()
      time = t
      lastKnown = t
    }
    t
  }

  /**
   * The time of the current batch if it was needed yet, else of the last batch that needed one
   * (for background cleanup; the commit judges its findings again with its own time).
   */
  def lastBatchTime: Option[BatchTime] = Option(time).orElse(Option(lastKnown))

  def now(cf: String): Long = batchTime.now(config(cf).timeCharacteristic)

  /** The stamp of a value written now to `cf` (with or without TTL: see [[TtlValueCodec]]). */
  def stamp(cf: String): Long = now(cf)

  /**
   * What a point read of `key` returns: the stored bytes, fewer elements of them, or null when
   * everything is expired and hidden. A writable store refreshes unexpired entries it reads when
   * the update type is `OnReadAndWrite`; an expired entry is never brought back by a read.
   */
  def onRead(cf: String, multi: Boolean, key: Array[Byte], bytes: Array[Byte], writable: Boolean): Array[Byte] = {
    if (bytes == null) return null
    val cfg = config(cf)
    if (!cfg.enabled) return bytes
    val now = this.now(cf)
    if (!multi) {
      val stamp = TtlValueCodec.stampOf(bytes, cf)
      if (cfg.expired(stamp, now)) {
        if (cfg.hidesExpired) { record(s => s.copy(expiredHidden = s.expiredHidden + 1)); null } else bytes
      } else if (writable && cfg.refreshOnRead && stamp != now) {
        val fresh = TtlValueCodec.restamp(bytes, now)
        rewrite(cf, key, fresh)
        fresh
      } else bytes
    } else {
      val elements = TtlValueCodec.elements(bytes, cf)
      val (dead, live) = elements.partition(e => cfg.expired(e.stamp, now))
      val refresh = writable && cfg.refreshOnRead && live.exists(_.stamp != now)
      val liveSet = live.toSet
      val stampOf: TtlValueCodec.Element => Long = e => if (refresh && liveSet(e)) now else e.stamp
      if (refresh) rewrite(cf, key, TtlValueCodec.rebuild(bytes, elements, stampOf))
      if (cfg.hidesExpired && dead.nonEmpty) {
        record(s => s.copy(expiredHidden = s.expiredHidden + dead.size))
        if (live.isEmpty) null else TtlValueCodec.rebuild(bytes, live, stampOf)
      } else if (refresh) TtlValueCodec.rebuild(bytes, elements, stampOf)
      else bytes
    }
  }

  /**
   * What a reader of a committed version sees of a stored entry, judged at that version's batch
   * `time`: expired entries or elements hidden as reads hide them, nothing refreshed or counted.
   */
  def visibleAt(cf: String, multi: Boolean, bytes: Array[Byte], time: => BatchTime): Array[Byte] = {
    val cfg = config(cf)
    if (bytes == null || !cfg.hidesExpired) bytes
    else {
      val now = time.now(cfg.timeCharacteristic)
      if (!multi) { if (cfg.expired(TtlValueCodec.stampOf(bytes, cf), now)) null else bytes }
      else {
        val elements = TtlValueCodec.elements(bytes, cf)
        val live = elements.filterNot(e => cfg.expired(e.stamp, now))
        if (live.isEmpty) null
        else if (live.size == elements.size) bytes
        else TtlValueCodec.rebuild(bytes, live, _.stamp)
      }
    }
  }

  /**
   * What a scan shows of a stored entry: as `onRead`, but scans never refresh (an operator that
   * scans all its state every batch, e.g. for timeouts, would otherwise keep everything alive).
   */
  def onScan(cf: String, multi: Boolean, bytes: Array[Byte]): Array[Byte] =
    onRead(cf, multi, null, bytes, writable = false)
}
