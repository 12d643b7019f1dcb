package io.keyedstate.rocks

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, RocksDBKeyStateEncoder, UnsafeRowDataEncoder}
import org.apache.spark.sql.types.StructType
import org.apache.spark.unsafe.Platform
import io.keyedstate.shims.SparkShims

/**
 * How one column family's rows become RocksDB bytes.
 *
 * Keys use Spark's own key encoders for the column family's [[KeyStateEncoderSpec]], so prefix
 * scans and the order-preserving range-scan encoding behave exactly as operators expect. A family
 * whose keys give their key-group tag back ([[KeyGroupRule]]) stores them as that encoding alone;
 * the others' stored keys end with the tag ([[KeyGroups]]), scan bounds and prefixes do not. Values
 * are the UnsafeRow bytes after an 8-byte last-access stamp (`[int64 stamp][row]`, for TTL). In a
 * multi-value column family the stored value is a sequence of `[int32 length][int64 stamp][row]`
 * entries, appended by RocksDB's string-append merge operator with an empty delimiter, so `merge`
 * never reads the old value.
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
  private val partitionOrdinals = KeyGroups.partitionKeyOrdinals(storeName, keySchema, keySpec)
  private lazy val keyGroups = new KeyGroupHasher(keySchema, partitionOrdinals)

  /** Whether stored keys end with their key-group tag: only when the key cannot give it back. */
  val keysTagged: Boolean = KeyGroupRule.of(keySchema, keySpec, partitionOrdinals).isEmpty

  def supportsPrefixScan: Boolean = keyEncoder.supportPrefixKeyScan
  val supportsRangeScan: Boolean = SparkShims.supportsRangeScan(keySpec, keyEncoder)

  /** The stored key: Spark's encoding, followed by the key-group tag if [[keysTagged]]. */
  def encodeKey(key: UnsafeRow): Array[Byte] =
    if (keysTagged) KeyGroups.withTag(keyEncoder.encodeKey(key), keyGroups.tag(key))
    else {
      val encoded = keyEncoder.encodeKey(key)
      // Spark's no-prefix encoding may hand back the row's own buffer, which its caller reuses.
      if (encoded eq key.getBaseObject) encoded.clone() else encoded
    }
  /** A range-scan bound: Spark's encoding alone, so it sorts before every tagged key it starts. */
  def encodeBound(key: UnsafeRow): Array[Byte] = keyEncoder.encodeKey(key)
  def encodePrefix(prefix: UnsafeRow): Array[Byte] = keyEncoder.encodePrefixKey(prefix)
  /** A fresh row: Spark's decoder reuses one row object, callers may keep ours. */
  def decodeKey(bytes: Array[Byte]): UnsafeRow =
    keyEncoder.decodeKey(if (keysTagged) KeyGroups.withoutTag(bytes) else bytes).copy()

  // Values carry a last-access stamp (see ttl.TtlValueCodec for the layout); TTL decisions are
  // made by ttl.TtlState, the codec only (de)serialises.

  def encodeValue(value: UnsafeRow, stamp: Long): Array[Byte] =
    if (multipleValues) encodeValues(Array(value), stamp) else TtlValueCodec.single(value, stamp)

  def encodeValues(values: Array[UnsafeRow], stamp: Long): Array[Byte] = {
    require(multipleValues, s"column family '$name' does not hold multiple values per key")
    TtlValueCodec.multi(values, stamp)
  }

  /** A value (one stamp) or a multi-value entry (a stamp per element) with the stamps it had
   *  when it was read out of a store: a restored savepoint's last-access times. */
  def encodeStamped(values: Array[UnsafeRow], stamps: Array[Long]): Array[Byte] = {
    require(values.length == stamps.length && (multipleValues || values.length == 1),
      s"column family '$name': ${values.length} values with ${stamps.length} stamps")
    if (multipleValues) TtlValueCodec.multi(values, stamps(_)) else TtlValueCodec.single(values.head, stamps.head)
  }

  /** Each value of a stored entry with its last-access stamp. */
  def decodeStamped(bytes: Array[Byte]): IndexedSeq[(UnsafeRow, Long)] =
    if (!multipleValues) IndexedSeq(decodeValue(bytes) -> TtlValueCodec.stampOf(bytes, name))
    else TtlValueCodec.elements(bytes, name).map(e => rowOf(bytes, e) -> e.stamp)

  def decodeValue(bytes: Array[Byte]): UnsafeRow =
    if (multipleValues) decodeValues(bytes).headOption.orNull
    else rowOf(bytes, TtlValueCodec.StampBytes, bytes.length - TtlValueCodec.StampBytes)

  def decodeValues(bytes: Array[Byte]): IndexedSeq[UnsafeRow] =
    if (!multipleValues) IndexedSeq(decodeValue(bytes))
    else TtlValueCodec.elements(bytes, name).map(rowOf(bytes, _))

  /** The row of one element of a multi-value entry. */
  def rowOf(bytes: Array[Byte], e: TtlValueCodec.Element): UnsafeRow = rowOf(bytes, e.offset, e.length)

  private def rowOf(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow = {
    if (length < 0) TtlValueCodec.corrupt(bytes, name)
    val row = new UnsafeRow(numValueFields)
    // Bytes from RocksDB are fresh arrays: point into them (as Spark's own value decoder does).
    row.pointTo(bytes, Platform.BYTE_ARRAY_OFFSET + offset, length)
    row
  }
}
