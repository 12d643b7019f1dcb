package io.keyedstate.ttl

import java.util.concurrent.ConcurrentLinkedQueue
import java.util.concurrent.atomic.AtomicInteger

import scala.collection.mutable

import io.keyedstate.conf.TtlConfig
import io.keyedstate.rocks.TtlValueCodec

/**
 * The cleanup strategies: each removes expired entries from the loaded instance as ordinary
 * deletes (or, for a multi-value entry with some live elements, a rewrite of the live ones), so
 * removals reach the changelog and the exact key counts like any other write. See docs/ttl.md.
 *
 *  - incremental: a cursor (the last key checked, per column family, kept in the manifest so it
 *    survives restarts and replays identically) checks `size` entries per commit, or per state
 *    access with `everyRecord`;
 *  - full snapshot: a commit that takes a snapshot first removes every expired entry, so the
 *    snapshot leaves them out;
 *  - compaction: a commit that takes a snapshot removes every expired entry and then compacts the
 *    key range that removals (of any strategy) touched since the last compaction, so the values
 *    and tombstones leave the SST files before they are checkpointed;
 *  - background: the maintenance thread scans read-only for expired keys and hands them to the
 *    next commit, which checks them again and removes them.
 */
final class TtlCleanup(inst: TtlCleanupTarget, ttl: TtlState, initialCursors: Map[String, String]) {
  import TtlCleanup._

  private val cursors = mutable.Map[String, Array[Byte]]() ++ initialCursors.map { case (cf, hex) => cf -> fromHex(hex) }
  // Since the last compaction: the smallest and largest key removed, per column family.
  private val removedRanges = mutable.Map[String, (Array[Byte], Array[Byte])]()
  // Background findings waiting for the next commit (written by the maintenance thread).
  private val candidates = new ConcurrentLinkedQueue[(String, Array[Byte])]()
  private val candidateCount = new AtomicInteger()

  // The TTL column families as of the last batch start or commit; volatile for the background scan.
  @volatile private var ttlCfs: Seq[(String, Boolean, TtlConfig)] = Nil
  private var everyRecord: Seq[(String, Int)] = Nil

  /** Re-reads the column families (they may be created by a batch). */
  def refresh(): Unit = {
    ttlCfs = inst.db.columnFamilies.toSeq.sorted.map(cf => (cf, inst.isMultiValue(cf), ttl.config(cf)))
      .filter(_._3.enabled)
    everyRecord = ttlCfs.collect {
      case (cf, _, c) if c.cleanupIncrementalEveryRecord && c.cleanupIncrementalSize > 0 => cf -> c.cleanupIncrementalSize
    }
  }

  /** The cursors as the next manifest records them. */
  def cursorsForManifest: Map[String, String] = {
    val existing = inst.db.columnFamilies
    cursors.iterator.collect { case (cf, k) if existing(cf) => cf -> toHex(k) }.toMap
  }

  /** A state access on a writable store (incremental cleanup with `everyRecord`). */
  def onAccess(): Unit = if (everyRecord.nonEmpty) everyRecord.foreach { case (cf, n) => incremental(cf, n) }

  /** The strategies that run at commit, before the changelog is closed. */
  def beforeCommit(snapshotPlanned: Boolean): Unit = {
    refresh()
    if (ttlCfs.isEmpty) {
      candidates.clear(); candidateCount.set(0)
      return
    }
    drainCandidates()
    ttlCfs.foreach { case (cf, _, c) =>
      if (!c.cleanupIncrementalEveryRecord && c.cleanupIncrementalSize > 0) incremental(cf, c.cleanupIncrementalSize)
    }
    if (snapshotPlanned) {
      ttlCfs.foreach { case (cf, _, c) =>
        if (c.cleanupCompaction) {
          fullScan(cf, CleanupStrategy.Compaction)
          compact(cf)
        } else if (c.cleanupFullSnapshot) fullScan(cf, CleanupStrategy.FullSnapshot)
      }
    }
  }

  /** Removes the expired part of one stored entry; returns how many entries (elements) went. */
  private def removeExpired(cf: String, key: Array[Byte], bytes: Array[Byte], strategy: CleanupStrategy): Int = {
    val cfg = ttl.config(cf)
    val now = ttl.now(cf)
    val removed =
      if (!inst.isMultiValue(cf)) {
        if (cfg.expired(TtlValueCodec.stampOf(bytes, cf), now)) { inst.delete(cf, key); 1 } else 0
      } else {
        val elements = TtlValueCodec.elements(bytes, cf)
        val live = elements.filterNot(e => cfg.expired(e.stamp, now))
        if (live.size == elements.size) 0
        else {
          if (live.isEmpty) inst.delete(cf, key)
          else inst.write(cf, key, TtlValueCodec.rebuild(bytes, live), merge = false)
          elements.size - live.size
        }
      }
    if (removed > 0) {
      ttl.record(_.removed(strategy, removed.toLong))
      noteRemoved(cf, key)
    }
    removed
  }

  private def noteRemoved(cf: String, key: Array[Byte]): Unit = {
    val (lo, hi) = removedRanges.getOrElse(cf, (key, key))
    removedRanges(cf) = (
      if (java.util.Arrays.compareUnsigned(key, lo) < 0) key else lo,
      if (java.util.Arrays.compareUnsigned(key, hi) > 0) key else hi)
  }

  /** Checks up to `n` entries after the cursor; at the end of the column family it starts over. */
  private def incremental(cf: String, n: Int): Unit = {
    // The smallest key after the cursor is the cursor with a zero byte appended.
    val it = inst.db.scan(cf, cursors.get(cf).map(_ :+ 0.toByte), None)
    var checked = 0
    var last: Array[Byte] = null
    try {
      while (checked < n && it.hasNext) {
        val (k, v) = it.next()
        removeExpired(cf, k, v, CleanupStrategy.Incremental)
        last = k
        checked += 1
      }
    } finally it.close()
    if (checked < n) cursors.remove(cf) else cursors(cf) = last
  }

  private def fullScan(cf: String, strategy: CleanupStrategy): Unit = {
    // A RocksDB iterator reads a consistent view: deleting behind it is safe.
    val it = inst.db.scan(cf, None, None)
    try it.foreach { case (k, v) => removeExpired(cf, k, v, strategy) } finally it.close()
  }

  /** Compacts the range removals touched, down to the last level, so their bytes leave the SSTs. */
  private def compact(cf: String): Unit = removedRanges.remove(cf).foreach { case (lo, hi) =>
    inst.db.compactRange(cf, lo, hi)
  }

  // ---- background ----

  /**
   * Runs on the maintenance thread, concurrently with a task using the instance: reads only, and
   * queues the keys of entries that were expired at the last batch's time. Returns how many it
   * queued. Skipped while earlier findings still wait for a commit.
   */
  def backgroundScan(): Int = {
    val cfs = ttlCfs.filter(_._3.cleanupBackground)
    val time = ttl.lastBatchTime
    if (cfs.isEmpty || time.isEmpty || !candidates.isEmpty) return 0
    inst.readGuarded {
      var found = 0
      cfs.foreach { case (cf, multi, cfg) =>
        val now = time.get.now(cfg.timeCharacteristic)
        val it = inst.db.scan(cf, None, None)
        try {
          var seen = 0
          while (it.hasNext && candidateCount.get < MaxCandidates && !inst.isClosing) {
            val (k, v) = it.next()
            val expired =
              if (multi) TtlValueCodec.elements(v, cf).exists(e => cfg.expired(e.stamp, now))
              else cfg.expired(TtlValueCodec.stampOf(v, cf), now)
            if (expired) {
              candidates.add(cf -> k)
              candidateCount.incrementAndGet()
              found += 1
            }
            seen += 1
          }
        } finally it.close()
      }
      found
    }.getOrElse(0)
  }

  private def drainCandidates(): Unit = {
    var next = candidates.poll()
    while (next != null) {
      candidateCount.decrementAndGet()
      val (cf, key) = next
      // Checked again: the entry may have been rewritten (or removed) since it was found.
      if (inst.db.hasColumnFamily(cf) && ttl.config(cf).enabled) {
        val bytes = inst.db.get(cf, key)
        if (bytes != null) removeExpired(cf, key, bytes, CleanupStrategy.Background)
      }
      next = candidates.poll()
    }
  }
}

object TtlCleanup {
  /** At most this many background findings wait for a commit (about 100 bytes each). */
  val MaxCandidates = 1000000

  private def toHex(b: Array[Byte]): String = b.map(x => f"${x & 0xff}%02x").mkString
  private def fromHex(s: String): Array[Byte] = s.grouped(2).map(Integer.parseInt(_, 16).toByte).toArray
}
