package io.keyedstate.rocks

import java.util.Arrays

/**
 * The writes of one column family that are not in RocksDB yet, in the heap: for each key the
 * outcome of its writes so far, a value ([[WriteTable.Put]]), a deletion ([[WriteTable.Delete]])
 * or merge operands still to be appended to whatever RocksDB holds ([[WriteTable.Merge]]). The
 * merge operator is plain concatenation (`StringAppendOperator("")`), so a merge onto a put or a
 * delete folds into a put here, and merges onto merges into one operand.
 *
 * The slots are [[ByteKeySlots]]; the payload is a kind, a value and its length per slot. Keys
 * and values are copied in (callers reuse their arrays) and out. No removal: a table is dropped
 * whole once RocksDB holds its writes. Not thread-safe: [[BufferedWrites]] guards it.
 */
private[rocks] final class WriteTable extends ByteKeySlots(WriteTable.InitialCapacity) {
  import WriteTable._

  private var kinds = new Array[Byte](InitialCapacity)
  private var values = new Array[Array[Byte]](InitialCapacity) // may be longer than the value
  private var lengths = new Array[Int](InitialCapacity)
  private var bytes = 0L

  /** What the table takes in the heap, about: keys, values and the slots' share. */
  def heapBytes: Long = bytes + keys.length.toLong * SlotBytes

  /** The slot of `key`, or -1. */
  def find(key: Array[Byte]): Int = {
    val i = slot(key, key.length, hash(key))
    if (keys(i) == null) -1 else i
  }

  def kind(slot: Int): Byte = kinds(slot)

  /** A copy of the value or merge operands in `slot` (not of a [[WriteTable.Delete]]). */
  def value(slot: Int): Array[Byte] = Arrays.copyOf(values(slot), lengths(slot))

  def put(key: Array[Byte], value: Array[Byte]): Unit = set(key, Put, value.clone())
  def delete(key: Array[Byte]): Unit = set(key, Delete, null)

  /** Appends a merge operand to what the key's writes left so far. */
  def merge(key: Array[Byte], operand: Array[Byte]): Unit = {
    val h = hash(key)
    val i = slot(key, key.length, h)
    if (keys(i) == null) insert(i, key, h, Merge, operand.clone())
    else kinds(i) match {
      case Delete => replace(i, Put, operand.clone()) // a merge onto nothing: the operand alone
      case _ => append(i, operand) // onto a value (still a put) or onto operands (still a merge)
    }
  }

  /**
   * Hands every key's kind, key and value (null for a delete) to `f`, in RocksDB's key order. The
   * arrays are the table's own, not copies: `f` must not change them.
   */
  def foreachInKeyOrder(f: (Byte, Array[Byte], Array[Byte]) => Unit): Unit = sortedKeys.foreach { key =>
    val i = find(key)
    f(kinds(i), key, if (kinds(i) == Delete) null else if (lengths(i) == values(i).length) values(i) else value(i))
  }

  /** The keys in RocksDB's order (unsigned bytes). */
  private def sortedKeys: Array[Array[Byte]] = {
    val sorted = new Array[Array[Byte]](count)
    var n = 0
    var i = 0
    while (i < keys.length) {
      if (keys(i) != null) { sorted(n) = keys(i); n += 1 }
      i += 1
    }
    Arrays.sort(sorted, (a: Array[Byte], b: Array[Byte]) => Arrays.compareUnsigned(a, b))
    sorted
  }

  private def set(key: Array[Byte], kind: Byte, value: Array[Byte]): Unit = {
    val h = hash(key)
    val i = slot(key, key.length, h)
    if (keys(i) == null) insert(i, key, h, kind, value) else replace(i, kind, value)
  }

  private def insert(i: Int, key: Array[Byte], h: Int, kind: Byte, value: Array[Byte]): Unit = {
    kinds(i) = kind
    values(i) = value
    lengths(i) = if (value == null) 0 else value.length
    bytes += key.length + lengths(i) + ArrayBytes * 2
    claim(i, key.clone(), h)
  }

  private def replace(i: Int, kind: Byte, value: Array[Byte]): Unit = {
    bytes -= capacityOf(i)
    kinds(i) = kind
    values(i) = value
    lengths(i) = if (value == null) 0 else value.length
    bytes += capacityOf(i)
  }

  // Doubling, so that many appends to one key (a list's elements) cost linear time.
  private def append(i: Int, operand: Array[Byte]): Unit = {
    val length = lengths(i) + operand.length
    if (values(i).length < length) {
      bytes -= capacityOf(i)
      values(i) = Arrays.copyOf(values(i), math.max(length, values(i).length * 2))
      bytes += capacityOf(i)
    }
    System.arraycopy(operand, 0, values(i), lengths(i), operand.length)
    lengths(i) = length
  }

  private def capacityOf(i: Int): Int = if (values(i) == null) 0 else values(i).length

  protected def relocate(capacity: Int, newSlot: Array[Int]): Unit = {
    val (oldKinds, oldValues, oldLengths) = (kinds, values, lengths)
    kinds = new Array[Byte](capacity)
    values = new Array[Array[Byte]](capacity)
    lengths = new Array[Int](capacity)
    var j = 0
    while (j < newSlot.length) {
      val i = newSlot(j)
      if (i >= 0) { kinds(i) = oldKinds(j); values(i) = oldValues(j); lengths(i) = oldLengths(j) }
      j += 1
    }
  }
}

private[rocks] object WriteTable {
  /** The key's writes leave this value. */
  final val Put: Byte = 1
  /** The key's writes leave it deleted. */
  final val Delete: Byte = 2
  /** These operands are appended to what RocksDB holds for the key (nothing, if it holds none). */
  final val Merge: Byte = 3

  private val InitialCapacity = 256 // a power of two
  // A Java array's header, and a slot's share of the five arrays (two references, an int, a byte, an int).
  private val ArrayBytes = 16
  private val SlotBytes = 17

  private def hash(key: Array[Byte]): Int = ByteKeySlots.hash(key, key.length)
}
