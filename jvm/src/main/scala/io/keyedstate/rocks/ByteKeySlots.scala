package io.keyedstate.rocks

import java.util.Arrays

import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.hash.Murmur3_x86_32

/**
 * The slots of a hash table from byte-array keys, the part the key count's memo
 * (`io.keyedstate.ByteKeyTable`) and the write buffer's tables ([[WriteTable]]) share: open
 * addressing with linear probing over parallel arrays (no entry objects, no boxing), at most half
 * full so probe runs stay short. Each slot keeps its key's hash, so probes compare whole keys only
 * on a hash match and growing never rehashes a key. Subclasses keep their payload in arrays
 * parallel to the slots and move it when the table grows ([[relocate]]). No removal.
 */
private[keyedstate] abstract class ByteKeySlots(initialCapacity: Int) {
  protected var keys = new Array[Array[Byte]](initialCapacity) // null: an empty slot
  protected var hashes = new Array[Int](initialCapacity)
  protected var count = 0

  /** Keys held. */
  def size: Int = count

  /** The slot holding `key(0 until len)` (whose hash is `h`), or the empty slot where it would go. */
  protected final def slot(key: Array[Byte], len: Int, h: Int): Int = {
    val mask = keys.length - 1
    var i = h & mask
    while (keys(i) != null && !(hashes(i) == h && ByteKeySlots.sameBytes(keys(i), key, len))) i = (i + 1) & mask
    i
  }

  /**
   * Fills the empty slot `i` with `key` (the caller's copy) and its hash, once the subclass set the
   * slot's payload; the table may grow, so `i` is not valid after.
   */
  protected final def claim(i: Int, key: Array[Byte], h: Int): Unit = {
    keys(i) = key
    hashes(i) = h
    count += 1
    if (count * 2 > keys.length) grow()
  }

  /** Empties every slot, keeping the arrays (the payload's stays, unread). */
  protected final def emptySlots(): Unit = {
    Arrays.fill(keys.asInstanceOf[Array[AnyRef]], null)
    count = 0
  }

  /**
   * The table grew to `capacity` slots: the subclass allocates its payload arrays anew and copies
   * the payload of each old slot `j` with `newSlot(j) >= 0` to `newSlot(j)`.
   */
  protected def relocate(capacity: Int, newSlot: Array[Int]): Unit

  private def grow(): Unit = {
    val (oldKeys, oldHashes) = (keys, hashes)
    keys = new Array[Array[Byte]](oldKeys.length * 2)
    hashes = new Array[Int](keys.length)
    val newSlot = new Array[Int](oldKeys.length)
    val mask = keys.length - 1
    var j = 0
    while (j < oldKeys.length) {
      if (oldKeys(j) != null) {
        var i = oldHashes(j) & mask
        while (keys(i) != null) i = (i + 1) & mask
        keys(i) = oldKeys(j)
        hashes(i) = oldHashes(j)
        newSlot(j) = i
      } else newSlot(j) = -1
      j += 1
    }
    relocate(keys.length, newSlot)
  }
}

private[keyedstate] object ByteKeySlots {
  /** The hash of `key(0 until len)`. */
  def hash(key: Array[Byte], len: Int): Int =
    Murmur3_x86_32.hashUnsafeBytes(key, Platform.BYTE_ARRAY_OFFSET, len, 42)

  private def sameBytes(stored: Array[Byte], key: Array[Byte], len: Int): Boolean =
    stored.length == len && Arrays.equals(stored, 0, len, key, 0, len)
}
