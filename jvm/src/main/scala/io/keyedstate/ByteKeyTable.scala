package io.keyedstate

import java.util.Arrays

import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.hash.Murmur3_x86_32

/**
 * A hash table from byte-array keys, or their first `len` bytes, to a small non-zero state: the
 * key count's memo ([[KeyMemo]]) asks and records in one probe per write. Open addressing with
 * linear probing over parallel arrays (no entry objects, no boxing); each slot keeps its key's
 * hash, so probes compare whole keys only on a hash match and growing never rehashes a key. A key
 * is copied only when inserted (callers' arrays may be reused). No removal: the memo is dropped
 * as a whole at commit.
 */
private[keyedstate] final class ByteKeyTable {
  import ByteKeyTable._

  private var keys = new Array[Array[Byte]](InitialCapacity)
  private var hashes = new Array[Int](InitialCapacity)
  private var states = new Array[Byte](InitialCapacity)
  private var count = 0

  def size: Int = count

  /** The state of `key(0 until len)`, or [[ByteKeyTable.Missing]]. */
  def get(key: Array[Byte], len: Int): Byte = {
    val i = slot(key, len, hash(key, len))
    if (keys(i) == null) Missing else states(i)
  }

  /**
   * Sets the state of `key` (unless it is held and not `overwrite`), inserting a copy of it only
   * if `mayInsert`, and returns its state before ([[ByteKeyTable.Missing]] if not held).
   */
  def put(key: Array[Byte], state: Byte, mayInsert: Boolean, overwrite: Boolean = true): Byte = {
    val h = hash(key, key.length)
    val i = slot(key, key.length, h)
    if (keys(i) != null) {
      val before = states(i)
      if (overwrite) states(i) = state
      before
    } else {
      if (mayInsert) {
        keys(i) = key.clone()
        hashes(i) = h
        states(i) = state
        count += 1
        if (count * 2 > keys.length) grow() // at most half full: probe runs stay short
      }
      Missing
    }
  }

  /**
   * Empties the table. Up to [[ByteKeyTable.KeptCapacity]] slots it keeps its arrays: the memo is
   * cleared at every commit and fills again with the next batch's keys, and growing to them
   * again rehashes every key several times.
   */
  def clear(): Unit = if (keys.length > KeptCapacity) {
    keys = new Array[Array[Byte]](InitialCapacity)
    hashes = new Array[Int](InitialCapacity)
    states = new Array[Byte](InitialCapacity)
    count = 0
  } else if (count > 0) {
    Arrays.fill(keys.asInstanceOf[Array[AnyRef]], null)
    count = 0
  }

  /** The slot holding `key(0 until len)`, or the empty slot where it would go. */
  private def slot(key: Array[Byte], len: Int, h: Int): Int = {
    val mask = keys.length - 1
    var i = h & mask
    while (keys(i) != null && !(hashes(i) == h && sameBytes(keys(i), key, len))) i = (i + 1) & mask
    i
  }

  private def grow(): Unit = {
    val (oldKeys, oldHashes, oldStates) = (keys, hashes, states)
    keys = new Array[Array[Byte]](oldKeys.length * 2)
    hashes = new Array[Int](keys.length)
    states = new Array[Byte](keys.length)
    val mask = keys.length - 1
    var j = 0
    while (j < oldKeys.length) {
      if (oldKeys(j) != null) {
        var i = oldHashes(j) & mask
        while (keys(i) != null) i = (i + 1) & mask
        keys(i) = oldKeys(j)
        hashes(i) = oldHashes(j)
        states(i) = oldStates(j)
      }
      j += 1
    }
  }
}

private[keyedstate] object ByteKeyTable {
  /** The state of a key the table does not hold; stored states are never 0. */
  final val Missing: Byte = 0
  private val InitialCapacity = 1024 // a power of two
  private val KeptCapacity = 1 << 18 // slots: 3.3 MB of arrays

  private def hash(key: Array[Byte], len: Int): Int =
    Murmur3_x86_32.hashUnsafeBytes(key, Platform.BYTE_ARRAY_OFFSET, len, 42)

  private def sameBytes(stored: Array[Byte], key: Array[Byte], len: Int): Boolean =
    stored.length == len && Arrays.equals(stored, 0, len, key, 0, len)
}
