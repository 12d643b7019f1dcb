package io.keyedstate.rocks

import java.nio.ByteBuffer

import org.apache.spark.sql.catalyst.expressions.{BoundReference, Murmur3Hash, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType

/**
 * Key groups: every stored key ends with a 4-byte tag, the Murmur3 hash (seed 42) of the
 * operator's partitioning key, exactly the hash Spark's `HashPartitioning` computes before
 * `pmod(hash, numPartitions)`. The partition that owns a key under any partition count M is
 * `pmod(tag, M)`, readable from the stored key bytes alone: rescaling never decodes rows.
 *
 * The tag is a *suffix* so Spark's byte order (prefix scans, range scans) is unchanged: scan
 * bounds are encoded without a tag, and `encoded ++ tag` sorts right after `encoded`.
 * Layout and the partitioning-key rule are documented in docs/key-groups.md.
 */
object KeyGroups {
  /** Spark's `Murmur3Hash` default seed, the one `HashPartitioning` uses. */
  val Seed = 42
  val TagBytes = 4

  /** Spark's `Pmod(Murmur3Hash(keys), n)`: the partition owning a key group under `n` partitions. */
  def owner(tag: Int, numPartitions: Int): Int = {
    val m = tag % numPartitions
    if (m < 0) m + numPartitions else m
  }

  def tagOf(storedKey: Array[Byte]): Int = {
    require(storedKey.length >= TagBytes, s"stored key of ${storedKey.length} bytes has no key-group tag")
    ByteBuffer.wrap(storedKey, storedKey.length - TagBytes, TagBytes).getInt
  }

  def withTag(encoded: Array[Byte], tag: Int): Array[Byte] = {
    val out = java.util.Arrays.copyOf(encoded, encoded.length + TagBytes)
    ByteBuffer.wrap(out, encoded.length, TagBytes).putInt(tag)
    out
  }

  def withoutTag(storedKey: Array[Byte]): Array[Byte] =
    java.util.Arrays.copyOf(storedKey, storedKey.length - TagBytes)

  /**
   * The key columns Spark hash-partitions an operator's state by (the same rules as Spark's
   * `StatePartitionKeyExtractorFactory`): the whole key, except
   *  - stream-stream join `keyWithIndexToValue` stores: the join key, without the trailing index;
   *  - prefix-scan column families (session windows, composite keys): the prefix columns;
   *  - range-scan column families (timers): the columns that are not ordering columns.
   */
  def partitionKeyOrdinals(storeName: String, keySchema: StructType, spec: KeyStateEncoderSpec): Seq[Int] = {
    val all = keySchema.fields.indices
    spec match {
      case PrefixKeyScanStateEncoderSpec(_, n) => all.take(n)
      case RangeKeyScanStateEncoderSpec(_, ordering) =>
        val rest = all.filterNot(ordering.contains)
        if (rest.nonEmpty) rest else all
      case _ if storeName.endsWith("keyWithIndexToValue") && keySchema.length > 1 => all.dropRight(1)
      case _ => all
    }
  }
}

/** Computes the key-group tag of key rows of one column family (not thread-safe: one per codec). */
final class KeyGroupHasher(keySchema: StructType, ordinals: Seq[Int]) {
  private val projection = UnsafeProjection.create(Seq(new Murmur3Hash(
    ordinals.map(i => BoundReference(i, keySchema(i).dataType, keySchema(i).nullable)), KeyGroups.Seed)))

  def tag(key: UnsafeRow): Int = projection(key).getInt(0)
}
