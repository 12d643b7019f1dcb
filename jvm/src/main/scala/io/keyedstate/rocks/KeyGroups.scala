package io.keyedstate.rocks

import java.nio.ByteBuffer

import org.apache.spark.sql.catalyst.expressions.{BoundReference, Murmur3Hash, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.{DataType, StructType}
import org.json4s.jackson.JsonMethods

/**
 * Key groups: a stored key's tag is the Murmur3 hash (seed 42) of the operator's partitioning
 * key, exactly the hash Spark's `HashPartitioning` computes before `pmod(hash, numPartitions)`.
 * The partition that owns a key under any partition count M is `pmod(tag, M)`.
 *
 * Where the key alone gives the tag back (a [[KeyGroupRule]]: every key encoding but a range
 * scan hashed over its ordering columns), stored keys are Spark's encoding alone and rescaling
 * decodes a key to hash it; the tag is 4 random bytes no codec compresses, a third of an
 * aggregation's compressed SST entry. Otherwise the key ends with the 4-byte tag, a *suffix* so
 * Spark's byte order is unchanged: scan bounds are encoded without one, and `encoded ++ tag`
 * sorts right after `encoded`. Layout and the partitioning-key rule: docs/rescaling.md.
 */
object KeyGroups {
  /** Spark's `Murmur3Hash` default seed, the one `HashPartitioning` uses. */
  val Seed = 42
  val TagBytes = 4

  /**
   * Column families keyed by the partition that wrote an entry (a keyed function's operator
   * state, `$op_<name>`), not by a key Spark partitions: no key of theirs is "misplaced", and a
   * rescale gives each old partition's entry to the new partition its id hashes to.
   */
  val PartitionLocalPrefix = "$op_"
  def isPartitionLocal(columnFamily: String): Boolean = columnFamily.startsWith(PartitionLocalPrefix)

  /**
   * Column families every partition of an operator holds alike (a keyed function's broadcast
   * state, `$bc_<name>`): a rescale gives new partition `t` the family of old partition
   * `t % old count`, as Flink redistributes broadcast state.
   */
  val BroadcastPrefix = "$bc_"
  def isBroadcast(columnFamily: String): Boolean = columnFamily.startsWith(BroadcastPrefix)

  /** Whether a column family's keys belong to key groups (and may be misplaced). */
  def isKeyGrouped(columnFamily: String): Boolean = !isPartitionLocal(columnFamily) && !isBroadcast(columnFamily)

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
   * How a column family's stored keys give their tag (not thread-safe: one per scan): decoded and
   * hashed by its rule, or read from the stored tag when it has none.
   */
  def tagReader(storeName: String, keySchema: StructType, spec: KeyStateEncoderSpec): Array[Byte] => Int =
    KeyGroupRule.of(keySchema, spec, partitionKeyOrdinals(storeName, keySchema, spec)) match {
      case Some(rule) => rule.tagger()
      case None => tagOf
    }

  /** [[tagReader]] for a column family recorded as JSON (a manifest's key schema and encoder spec). */
  def tagReader(storeName: String, keySchemaJson: String, keySpecJson: String): Array[Byte] => Int = {
    val keySchema = DataType.fromJson(keySchemaJson).asInstanceOf[StructType]
    val spec = KeyStateEncoderSpec.fromJson(keySchema,
      JsonMethods.parse(keySpecJson).values.asInstanceOf[Map[String, Any]])
    tagReader(storeName, keySchema, spec)
  }

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

/**
 * How to compute a stored key's key-group tag from the key: the key schema, Spark's key encoding
 * and the partitioning-key columns. A column family with a rule stores its keys without the tag.
 */
final case class KeyGroupRule(keySchema: StructType, keySpec: KeyStateEncoderSpec, ordinals: Seq[Int]) {
  /** A function from a stored key (Spark's encoding) to its tag (not thread-safe: one per scan). */
  def tagger(): Array[Byte] => Int = {
    val decoder = keySpec.toEncoder(new UnsafeRowDataEncoder(keySpec, new StructType()), false)
    val hasher = new KeyGroupHasher(keySchema, ordinals)
    encoded => hasher.tag(decoder.decodeKey(encoded))
  }
}

object KeyGroupRule {
  /**
   * The rule of a column family, when decoding a stored key gives back exactly the values its
   * tag is hashed from: the partitioning columns are stored as Spark's row bytes (no prefix,
   * prefix-scan and the non-ordering columns of a range scan). A range scan hashed over its
   * ordering columns (the order-preserving encoding) has none: its keys keep their tags.
   */
  def of(keySchema: StructType, spec: KeyStateEncoderSpec, ordinals: Seq[Int]): Option[KeyGroupRule] =
    spec match {
      case RangeKeyScanStateEncoderSpec(_, ordering) if ordinals.exists(ordering.contains) => None
      case _ => Some(KeyGroupRule(keySchema, spec, ordinals))
    }
}
