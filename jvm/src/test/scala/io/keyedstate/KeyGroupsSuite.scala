package io.keyedstate

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{BoundReference, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning
import org.apache.spark.sql.execution.streaming.state.{NoPrefixKeyStateEncoderSpec, PrefixKeyScanStateEncoderSpec, RangeKeyScanStateEncoderSpec}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.rocks.{ColumnFamilyCodec, KeyGroupHasher, KeyGroups}

/** Key-group tags agree with the partition Spark's own hash partitioning computes. */
class KeyGroupsSuite extends AnyFunSuite {

  private val schema = StructType(Seq(
    StructField("id", LongType),
    StructField("name", StringType),
    StructField("score", DoubleType),
    StructField("window", StructType(Seq(StructField("start", LongType), StructField("end", LongType)))),
    StructField("index", LongType, nullable = false)))

  private def row(i: Int): UnsafeRow = {
    val name = if (i % 7 == 0) null else UTF8String.fromString(s"user-$i-${"x" * (i % 13)}")
    val window = if (i % 11 == 0) null else InternalRow(i.toLong * 1000, i.toLong * 1000 + 500)
    UnsafeProjection.create(schema)(InternalRow(i.toLong * 7919, name, i * 0.5 - 3, window, i.toLong)).copy()
  }

  /** Spark's partition of `r` when hash-partitioned by `ordinals` into `n` partitions. */
  private def sparkPartition(r: UnsafeRow, ordinals: Seq[Int], n: Int): Int = {
    val refs = ordinals.map(i => BoundReference(i, schema(i).dataType, schema(i).nullable))
    HashPartitioning(refs, n).partitionIdExpression.eval(r).asInstanceOf[Int]
  }

  test("the tag gives Spark's hash partition for every partition count, nulls and nested structs included") {
    for (ordinals <- Seq(Seq(0), Seq(1), Seq(0, 1, 2), Seq(3), Seq(0, 1, 2, 3))) {
      val hasher = new KeyGroupHasher(schema, ordinals)
      for (i <- 0 until 500; n <- Seq(1, 2, 3, 5, 8, 12, 200)) {
        val r = row(i)
        assert(KeyGroups.owner(hasher.tag(r), n) === sparkPartition(r, ordinals, n), s"row $i, $ordinals, $n partitions")
      }
    }
  }

  test("partitioning-key columns follow Spark's rules per operator store") {
    assert(KeyGroups.partitionKeyOrdinals("default", schema, NoPrefixKeyStateEncoderSpec(schema)) === (0 to 4))
    assert(KeyGroups.partitionKeyOrdinals("left-keyWithIndexToValue", schema, NoPrefixKeyStateEncoderSpec(schema)) ===
      (0 to 3))
    assert(KeyGroups.partitionKeyOrdinals("right-keyToNumValues", schema, NoPrefixKeyStateEncoderSpec(schema)) ===
      (0 to 4))
    assert(KeyGroups.partitionKeyOrdinals("default", schema, PrefixKeyScanStateEncoderSpec(schema, 2)) === Seq(0, 1))
    assert(KeyGroups.partitionKeyOrdinals("default", schema, RangeKeyScanStateEncoderSpec(schema, Seq(4))) ===
      (0 to 3))
  }

  test("stored keys end with the tag, decode back, and keep Spark's prefix order") {
    val spec = PrefixKeyScanStateEncoderSpec(schema, 1)
    val codec = new ColumnFamilyCodec("default", "cf", schema, StructType(Seq(StructField("v", IntegerType))), spec,
      multipleValues = false, isInternal = false)
    val hasher = new KeyGroupHasher(schema, Seq(0))
    for (i <- 1 until 200) {
      val r = row(i)
      val stored = codec.encodeKey(r)
      assert(KeyGroups.tagOf(stored) === hasher.tag(r))
      assert(codec.decodeKey(stored) === r)
      val prefix = codec.encodePrefix(UnsafeProjection.create(Seq(BoundReference(0, LongType, true)))(r))
      assert(stored.take(prefix.length).sameElements(prefix), "a prefix scan must find the stored key")
    }
  }
}
