package io.keyedstate.rocks

import java.nio.ByteBuffer

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, RocksDBKeyStateEncoder, UnsafeRowDataEncoder}
import org.apache.spark.sql.types.StructType

import io.keyedstate.keygroups.{KeyGroupHasher, KeyGroups}

/**
 * How one column family's rows become RocksDB bytes.
 *
 * Keys use Spark's own key encoders for the column family's [[KeyStateEncoderSpec]], so prefix
 * scans and the order-preserving range-scan encoding behave exactly as operators expect; each
 * stored key ends with its key-group tag ([[KeyGroups]]), scan bounds and prefixes do not. Values
 * are the UnsafeRow bytes. In a multi-value column family the stored value is a sequence of
 * `[int32 length][row bytes]` entries, appended by RocksDB's string-append merge operator with an
 * empty delimiter, so `merge` never reads the old value.
 */
final class ColumnFamilyCodec(
    storeName: String,
    val name: String,
    val keySchema: StructType,
    val valueSchema: StructType,
    val keySpec: KeyStateEncoderSpec,
    val multipleValues: Boolean,
    val isInternal: Boolean) {

  private val keyEncoder: RocksDBKeyStateEncoder =
    keySpec.toEncoder(new UnsafeRowDataEncoder(keySpec, valueSchema), false)

  private val numValueFields = valueSchema.length
  private val keyGroups =
    new KeyGroupHasher(keySchema, KeyGroups.partitionKeyOrdinals(storeName, keySchema, keySpec))

  def supportsPrefixScan: Boolean = keyEncoder.supportPrefixKeyScan
  def supportsRangeScan: Boolean = keyEncoder.supportsRangeScan

  /** The stored key: Spark's encoding followed by the key-group tag. */
  def encodeKey(key: UnsafeRow): Array[Byte] = KeyGroups.withTag(keyEncoder.encodeKey(key), keyGroups.tag(key))
  /** A range-scan bound: Spark's encoding alone, so it sorts before every tagged key it starts. */
  def encodeBound(key: UnsafeRow): Array[Byte] = keyEncoder.encodeKey(key)
  def encodePrefix(prefix: UnsafeRow): Array[Byte] = keyEncoder.encodePrefixKey(prefix)
  /** A fresh row: Spark's decoder reuses one row object, callers may keep ours. */
  def decodeKey(bytes: Array[Byte]): UnsafeRow = keyEncoder.decodeKey(KeyGroups.withoutTag(bytes)).copy()

  def encodeValue(value: UnsafeRow): Array[Byte] =
    if (multipleValues) encodeValues(Array(value)) else value.getBytes

  def encodeValues(values: Array[UnsafeRow]): Array[Byte] = {
    require(multipleValues, s"column family '$name' does not hold multiple values per key")
    val size = values.iterator.map(_.getSizeInBytes + 4).sum
    val buf = ByteBuffer.allocate(size)
    values.foreach { v =>
      buf.putInt(v.getSizeInBytes)
      buf.put(v.getBytes)
    }
    buf.array()
  }

  def decodeValue(bytes: Array[Byte]): UnsafeRow =
    if (multipleValues) decodeValues(bytes).headOption.orNull else rowOf(bytes, 0, bytes.length)

  def decodeValues(bytes: Array[Byte]): IndexedSeq[UnsafeRow] = {
    if (!multipleValues) return IndexedSeq(rowOf(bytes, 0, bytes.length))
    val out = new ArrayBuffer[UnsafeRow]()
    val buf = ByteBuffer.wrap(bytes)
    while (buf.remaining() > 0) {
      if (buf.remaining() < 4) corrupt(bytes)
      val len = buf.getInt()
      if (len < 0 || len > buf.remaining()) corrupt(bytes)
      out += rowOf(bytes, buf.position(), len)
      buf.position(buf.position() + len)
    }
    out.toIndexedSeq
  }

  private def rowOf(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow = {
    val row = new UnsafeRow(numValueFields)
    // Bytes from RocksDB are fresh arrays: point at them unless only a slice is wanted.
    val data =
      if (offset == 0 && length == bytes.length) bytes
      else java.util.Arrays.copyOfRange(bytes, offset, offset + length)
    row.pointTo(data, length)
    row
  }

  private def corrupt(bytes: Array[Byte]): Nothing =
    throw new IllegalStateException(
      s"Corrupt multi-value entry (${bytes.length} bytes) in column family '$name'")
}
