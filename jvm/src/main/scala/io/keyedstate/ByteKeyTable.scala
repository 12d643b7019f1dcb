package io.keyedstate

import io.keyedstate.rocks.ByteKeySlots

/**
 * A hash table from byte-array keys, or their first `len` bytes, to a small non-zero state: the
 * key count's memo ([[KeyMemo]]) asks and records in one probe per write (the slots:
 * [[ByteKeySlots]]). A key is copied only when inserted (callers' arrays may be reused). No
 * removal: the memo is dropped as a whole at commit.
 */
private[keyedstate] final class ByteKeyTable extends ByteKeySlots(ByteKeyTable.InitialCapacity) {
  import ByteKeyTable._

  private var states = new Array[Byte](InitialCapacity)

  /** The state of `key(0 until len)`, or [[ByteKeyTable.Missing]]. */
  def get(key: Array[Byte], len: Int): Byte = {
    val i = slot(key, len, ByteKeySlots.hash(key, len))
    if (keys(i) == null) Missing else states(i)
  }

  /**
   * Sets the state of `key` (unless it is held and not `overwrite`), inserting a copy of it only
   * if `mayInsert`, and returns its state before ([[ByteKeyTable.Missing]] if not held).
   */
  def put(key: Array[Byte], state: Byte, mayInsert: Boolean, overwrite: Boolean = true): Byte = {
    val h = ByteKeySlots.hash(key, key.length)
    val i = slot(key, key.length, h)
    if (keys(i) != null) {
      val before = states(i)
      if (overwrite) states(i) = state
      before
    } else {
      if (mayInsert) {
        states(i) = state
        claim(i, key.clone(), h)
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
  } else if (count > 0) emptySlots()

  protected def relocate(capacity: Int, newSlot: Array[Int]): Unit = {
    val old = states
    states = new Array[Byte](capacity)
    var j = 0
    while (j < newSlot.length) { if (newSlot(j) >= 0) states(newSlot(j)) = old(j); j += 1 }
  }
}

private[keyedstate] object ByteKeyTable {
  /** The state of a key the table does not hold; stored states are never 0. */
  final val Missing: Byte = 0
  private val InitialCapacity = 1024 // a power of two
  private val KeptCapacity = 1 << 18 // slots: 3.3 MB of arrays
}
