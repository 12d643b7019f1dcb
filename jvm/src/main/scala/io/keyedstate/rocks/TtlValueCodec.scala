package io.keyedstate.rocks

import java.nio.ByteBuffer

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.sql.catalyst.expressions.UnsafeRow

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * The stored value layout that carries each entry's last-access timestamp (as Flink's
 * `TtlValue`: 8 bytes, big-endian, before the user bytes). Every value is stamped, with or
 * without a TTL, so TTL can be switched on later for state written before:
 *
 *  - single value: `[int64 stamp][row bytes]`
 *  - multiple values per key: a sequence of `[int32 row length][int64 stamp][row bytes]`
 *    elements, appended by the string-append merge operator; each element has its own stamp
 *    (Flink's per-element list TTL).
 */
object TtlValueCodec {
  val StampBytes = 8
  private val ElementHeader = 4 + StampBytes

  /** One element of a multi-value entry: its stamp and where its row bytes are. */
  final case class Element(stamp: Long, offset: Int, length: Int) {
    def end: Int = offset + length
  }

  def single(row: UnsafeRow, stamp: Long): Array[Byte] = {
    val size = row.getSizeInBytes
    val out = new Array[Byte](StampBytes + size)
    ByteBuffer.wrap(out).putLong(stamp)
    row.writeToMemory(out, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + StampBytes)
    out
  }

  def stampOf(bytes: Array[Byte], cf: String): Long = {
    if (bytes.length < StampBytes) corrupt(bytes, cf)
    ByteBuffer.wrap(bytes).getLong(0)
  }

  def multi(rows: Array[UnsafeRow], stamp: Long): Array[Byte] = multi(rows, _ => stamp)

  /** Elements with stamps of their own (`stampOf(i)` for `rows(i)`): a restored list keeps them. */
  def multi(rows: Array[UnsafeRow], stampOf: Int => Long): Array[Byte] = {
    val buf = ByteBuffer.allocate(rows.iterator.map(_.getSizeInBytes + ElementHeader).sum)
    rows.indices.foreach { i =>
      val r = rows(i)
      buf.putInt(r.getSizeInBytes)
      buf.putLong(stampOf(i))
      buf.put(r.getBytes)
    }
    buf.array()
  }

  def elements(bytes: Array[Byte], cf: String): IndexedSeq[Element] = {
    val out = new ArrayBuffer[Element]()
    val buf = ByteBuffer.wrap(bytes)
    while (buf.remaining() > 0) {
      if (buf.remaining() < ElementHeader) corrupt(bytes, cf)
      val len = buf.getInt()
      val stamp = buf.getLong()
      if (len < 0 || len > buf.remaining()) corrupt(bytes, cf)
      out += Element(stamp, buf.position(), len)
      buf.position(buf.position() + len)
    }
    out.toIndexedSeq
  }

  /** The value with the given elements only, each with the stamp `stampOf` gives it. */
  def rebuild(bytes: Array[Byte], keep: Seq[Element], stampOf: Element => Long = _.stamp): Array[Byte] = {
    val buf = ByteBuffer.allocate(keep.iterator.map(_.length + ElementHeader).sum)
    keep.foreach { e =>
      buf.putInt(e.length)
      buf.putLong(stampOf(e))
      buf.put(bytes, e.offset, e.length)
    }
    buf.array()
  }

  /** A single value with a new stamp (the row bytes unchanged). */
  def restamp(bytes: Array[Byte], stamp: Long): Array[Byte] = {
    val out = bytes.clone()
    ByteBuffer.wrap(out).putLong(0, stamp)
    out
  }

  private[rocks] def corrupt(bytes: Array[Byte], cf: String): Nothing =
    throw KeyedStateErrors.badState(ErrorId.StoredValueCorrupt,
      s"Corrupt stored value (${bytes.length} bytes) in column family '$cf': it does not decode as the family's format")
}
