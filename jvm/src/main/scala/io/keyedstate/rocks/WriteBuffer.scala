package io.keyedstate.rocks

import java.util.concurrent.atomic.AtomicLong

import scala.collection.mutable

/**
 * One generation of a [[LocalRocksDB]]'s writes held in the heap: a [[WriteTable]] per column
 * family, and its share of the executor-wide bound ([[WriteBuffer.overBound]]). Not thread-safe:
 * LocalRocksDB guards the generation it writes, and freezes the one it spills in the background.
 */
private[rocks] final class WriteBuffer {
  private val tables = mutable.HashMap[String, WriteTable]()
  private var accounted = 0L // this generation's bytes in the executor-wide total

  /** The family's table, or null. */
  def tableOrNull(cf: String): WriteTable = tables.getOrElse(cf, null)
  def tableFor(cf: String): WriteTable = tables.getOrElseUpdate(cf, new WriteTable)
  def columnFamilies: Iterable[String] = tables.keys
  def isEmpty: Boolean = tables.valuesIterator.forall(_.size == 0)
  def entries: Long = tables.valuesIterator.map(_.size.toLong).sum
  def entriesOf(cf: String): Long = tables.get(cf).map(_.size.toLong).getOrElse(0L)

  /** What the writes of `key` left it ([[WriteTable.Put]], ...), or [[WriteBuffer.Missing]]. */
  def kindOf(cf: String, key: Array[Byte]): Byte = {
    val t = tableOrNull(cf)
    val i = if (t == null) -1 else t.find(key)
    if (i < 0) WriteBuffer.Missing else t.kind(i)
  }
  def heapBytes: Long = accounted

  /** Brings the executor-wide total up to date after a write to `table`; its bytes before it. */
  def accountFor(before: Long, table: WriteTable): Unit = {
    val delta = table.heapBytes - before
    accounted += delta
    WriteBuffer.total.addAndGet(delta)
  }

  /** Drops one family's writes (written into RocksDB, or moot: the family was dropped). */
  def remove(cf: String): Unit = tables.remove(cf).foreach { t =>
    accounted -= t.heapBytes
    WriteBuffer.total.addAndGet(-t.heapBytes)
  }

  /** Drops every family's writes; the generation leaves the executor-wide total. */
  def release(): Unit = {
    tables.clear()
    WriteBuffer.total.addAndGet(-accounted)
    accounted = 0
  }
}

private[rocks] object WriteBuffer {
  /** [[WriteBuffer.kindOf]] a key the buffer does not hold. */
  final val Missing: Byte = 0

  private val total = new AtomicLong()

  /** Bytes the buffers of every store in this JVM hold (tests and metrics). */
  def executorTotal: Long = total.get()

  /**
   * The writing store spills its buffer into RocksDB when the executor's buffers together exceed
   * `boundBytes` and its own holds at least [[MinSpillBytes]] (or an eighth of the bound): the
   * stores that write spill, so the total stays near the bound without spilling tiny buffers
   * again and again while idle stores hold the rest.
   */
  def overBound(own: Long, boundBytes: Long): Boolean =
    total.get() > boundBytes && own >= math.min(MinSpillBytes, boundBytes / 8)

  private val MinSpillBytes = 4L * 1024 * 1024
}
