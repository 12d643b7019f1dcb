package io.keyedstate

import scala.collection.mutable

/**
 * Whether keys exist, per column family, as learnt from reads, writes and complete prefix scans
 * since the last commit: operators read a key (or scan its prefix) before they write it, so exact
 * key counting needs no second lookup. Bounded to `maxEntries` keys and prefixes in all; a key the
 * memo cannot answer for is looked up in RocksDB by the caller. Thread-safe: with Spark's
 * pipelined Python runner (`spark.python.udf.pipelined.enabled`) a keyed function's lookup reads
 * in the writer thread while its apply node writes in the task thread.
 */
private[keyedstate] final class KeyMemo(maxEntries: Int) {
  import KeyMemo._

  private final class ColumnFamilyMemo {
    val keys = new ByteKeyTable // Present or Absent
    // Prefixes scanned to their end, and their distinct lengths (few: one per prefix encoder).
    // A key under one of them that `keys` does not hold does not exist.
    val scanned = new ByteKeyTable
    var scannedLengths = Array.emptyIntArray
  }

  private val families = mutable.HashMap[String, ColumnFamilyMemo]()
  private var entries = 0
  // Written under the lock; read without it by `epoch`, before a read or a scan starts.
  @volatile private var lostTrack = 0L

  /**
   * Changes whenever the memo may have lost track of a key that exists (forgotten, or written
   * while the memo was full): a read or a prefix scan that started before cannot vouch for what
   * it saw.
   */
  def epoch: Long = lostTrack

  private def family(cf: String): ColumnFamilyMemo = families.getOrElseUpdate(cf, new ColumnFamilyMemo)
  private def hasRoom(n: Int): Boolean = entries + n <= maxEntries

  /**
   * A read that started at `startEpoch` found whether `key` exists. What a write recorded stays:
   * with the pipelined runner a write of the key may land between the lookup thread's read and
   * this call, and the read's answer is then the older one. A write the memo could not record (it
   * lost track since the read started) makes the answer unusable.
   */
  def learn(cf: String, key: Array[Byte], exists: Boolean, startEpoch: Long): Unit = synchronized {
    if (startEpoch == lostTrack) record(family(cf), key, exists, hasRoom(1), overwrite = false)
  }

  /**
   * A write makes `key` exist or not (`existsNow`): records that and answers whether the key
   * existed before, if the memo knows ([[KeyMemo.Present]], [[KeyMemo.Absent]]); if not,
   * [[KeyMemo.Unknown]] (the caller reads the store before writing).
   */
  def existedBefore(cf: String, key: Array[Byte], existsNow: Boolean): Byte = synchronized {
    val memo = family(cf)
    val room = hasRoom(1)
    val before = record(memo, key, existsNow, room)
    if (before != Unknown) before
    else {
      val answer = if (underScanned(memo, key)) Absent else Unknown
      if (!room) {
        // A key under a scanned prefix that comes to exist unrecorded would later pass for
        // absent: the scans stop answering.
        if (existsNow) {
          lostTrack += 1
          entries -= memo.scanned.size
          memo.scanned.clear()
          memo.scannedLengths = Array.emptyIntArray
        }
      }
      answer
    }
  }

  /**
   * A prefix scan that started at `startEpoch` reached its end having seen `keys`: every key
   * under `prefix` is now known. The scan read a snapshot: what writes since recorded is newer.
   */
  def learnScanned(cf: String, prefix: Array[Byte], keys: Iterable[Array[Byte]], startEpoch: Long): Unit =
    synchronized {
      if (startEpoch == lostTrack && hasRoom(keys.size + 1)) {
        val memo = family(cf)
        keys.foreach { key =>
          if (memo.keys.put(key, Present, mayInsert = true, overwrite = false) == Unknown) entries += 1
        }
        if (memo.scanned.put(prefix, Scanned, mayInsert = true) == Unknown) entries += 1
        if (!memo.scannedLengths.contains(prefix.length)) memo.scannedLengths :+= prefix.length
      }
    }

  /**
   * `cf` holds no key (the caller saw it empty in RocksDB): its keys need no lookup until one is
   * written, and the writes record themselves. A first batch, or a state no key has used yet,
   * then counts its keys without reading them. An empty family is its empty prefix scanned to its
   * end, with no key under it: the scans' rules (and their loss of track) apply as they are.
   */
  def learnEmpty(cf: String): Unit = synchronized { learnScanned(cf, Array.emptyByteArray, Nil, lostTrack) }

  /** Forgets one column family (dropped, or changed by a range delete). */
  def forget(cf: String): Unit = synchronized {
    lostTrack += 1
    families.remove(cf).foreach(memo => entries -= memo.keys.size + memo.scanned.size)
  }

  /** Forgets everything (a commit). */
  def clear(): Unit = synchronized {
    lostTrack += 1
    families.clear()
    entries = 0
  }

  /** Sets what is known of `key` (inserting it if `room`); returns what was known before. */
  private def record(memo: ColumnFamilyMemo, key: Array[Byte], exists: Boolean, room: Boolean,
      overwrite: Boolean = true): Byte = {
    val before = memo.keys.put(key, if (exists) Present else Absent, mayInsert = room, overwrite = overwrite)
    if (before == Unknown && room) entries += 1
    before
  }

  private def underScanned(memo: ColumnFamilyMemo, key: Array[Byte]): Boolean = {
    val lengths = memo.scannedLengths
    var i = 0
    while (i < lengths.length) {
      if (lengths(i) < key.length && memo.scanned.get(key, lengths(i)) == Scanned) return true
      i += 1
    }
    false
  }
}

private[keyedstate] object KeyMemo {
  final val Unknown: Byte = ByteKeyTable.Missing
  final val Absent: Byte = 1
  final val Present: Byte = 2
  private final val Scanned: Byte = 1
}
