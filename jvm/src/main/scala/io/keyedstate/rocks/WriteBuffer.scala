package io.keyedstate.rocks

import java.util.concurrent.atomic.AtomicLong

import scala.collection.mutable

/**
 * One generation of a [[LocalRocksDB]]'s writes held in the heap: a [[WriteTable]] per column
 * family, and its share of the executor-wide bound ([[WriteBuffer.overBound]]). Writes are not
 * thread-safe: [[BufferedWrites]] guards the generation it writes; a frozen one is only read.
 */
private[rocks] final class WriteBuffer {
  private val tables = mutable.HashMap[String, WriteTable]()
  private var accounted = 0L // this generation's bytes
  private var published = 0L // the part of them in the executor-wide total

  // The family of the last lookup and its table, in one reference: a store's reads and writes
  // mostly go to one family, and a frozen generation is read by several threads at once.
  @volatile private var last: (String, WriteTable) = _

  /** The family's table, or null. */
  def tableOrNull(cf: String): WriteTable = {
    val l = last
    if (l != null && (l._1 eq cf)) l._2
    else {
      val t = tables.getOrElse(cf, null)
      if (t != null) last = (cf, t)
      t
    }
  }

  def tableFor(cf: String): WriteTable = {
    val t = tableOrNull(cf)
    if (t != null) t
    else {
      val created = new WriteTable
      tables(cf) = created
      accountFor(0L, created) // its empty slots count: `remove` takes back all it holds
      created
    }
  }
  def columnFamilies: Iterable[String] = tables.keys
  def isEmpty: Boolean = tables.isEmpty // a table exists once a write made it
  def entries: Long = tables.valuesIterator.map(_.size.toLong).sum
  def entriesOf(cf: String): Long = tables.get(cf).map(_.size.toLong).getOrElse(0L)

  /** What the writes of `key` left it ([[WriteTable.Put]], ...), or [[WriteBuffer.Missing]]. */
  def kindOf(cf: String, key: Array[Byte]): Byte = {
    val t = tableOrNull(cf)
    val i = if (t == null) -1 else t.find(key)
    if (i < 0) WriteBuffer.Missing else t.kind(i)
  }
  def heapBytes: Long = accounted

  /**
   * Counts a write to `table`, which held `before` bytes before it. The executor-wide total hears
   * of a generation ahead of what it holds, by up to two [[WriteBuffer.PublishStep]]s: it is never
   * below what the buffers hold, yet the shared counter changes once a step, not once a write (one
   * shared counter updated by every write of every task costs more than the hash insert).
   */
  def accountFor(before: Long, table: WriteTable): Unit = {
    accounted += table.heapBytes - before
    if (accounted > published || published - accounted > 2 * WriteBuffer.PublishStep) publish()
  }

  private def publish(): Unit = {
    val reserved = if (accounted == 0) 0L else accounted + WriteBuffer.PublishStep
    WriteBuffer.total.addAndGet(reserved - published)
    published = reserved
  }

  /** Drops one family's writes (written into RocksDB, or moot: the family was dropped). */
  def remove(cf: String): Unit = tables.remove(cf).foreach { t =>
    last = null
    accounted -= t.heapBytes
    publish()
  }

  /** Drops every family's writes; the generation leaves the executor-wide total. */
  def release(): Unit = {
    tables.clear()
    last = null
    accounted = 0
    publish()
  }
}

private[rocks] object WriteBuffer {
  /** [[WriteBuffer.kindOf]] a key the buffer does not hold. */
  final val Missing: Byte = 0

  private val total = new AtomicLong()

  /** Bytes the buffers of every store in this JVM hold (tests and bench, through `LocalRocksDB.bufferedBytesInJvm`). */
  def executorTotal: Long = total.get()

  /**
   * Whether the buffers of every store in this JVM, live and frozen, hold more than `boundBytes`:
   * then a store that writes moves its live buffer into RocksDB and writes there directly, whatever
   * its own size, until the total is under the bound again (a hard bound: idle stores' buffers and
   * frozen ones count, and no store may add to them).
   */
  def overBound(boundBytes: Long): Boolean = total.get() > boundBytes

  private val PublishStep = 16L * 1024
}
