package io.keyedstate.rocks

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

  test("stored keys carry no tag where the key gives it back; every stored key gives Spark's partition, decodes back and keeps Spark's order") {
    val timerSchema = StructType(Seq(StructField("ts", LongType, nullable = false), StructField("id", LongType)))
    val timerRow = (i: Int) => UnsafeProjection.create(timerSchema)(InternalRow(i.toLong * 31, i.toLong)).copy()
    // (encoder spec, key schema, rows, partitioning columns, whether stored keys keep their tag)
    val families = Seq(
      (NoPrefixKeyStateEncoderSpec(schema), schema, row _, 0 to 4, false),
      (PrefixKeyScanStateEncoderSpec(schema, 2), schema, row _, Seq(0, 1), false),
      (RangeKeyScanStateEncoderSpec(schema, Seq(4)), schema, row _, 0 to 3, false),
      // a range scan hashed over its ordering columns: the order-preserving encoding keeps the tag
      (RangeKeyScanStateEncoderSpec(timerSchema, Seq(0, 1)), timerSchema, timerRow, Seq(0, 1), true))
    for ((spec, keySchema, rowOf, ordinals, tagged) <- families) withClue(s"$spec: ") {
      val codec = new ColumnFamilyCodec("default", "cf", keySchema, StructType(Seq(StructField("v", IntegerType))), spec,
        multipleValues = false, isInternal = false)
      assert(codec.keysTagged === tagged)
      val hasher = new KeyGroupHasher(keySchema, ordinals)
      val tagOf = KeyGroups.tagReader("default", keySchema.json, spec.json)
      for (i <- 1 until 300) {
        val r = rowOf(i)
        val stored = codec.encodeKey(r)
        assert(stored.length === codec.encodeBound(r).length + (if (tagged) KeyGroups.TagBytes else 0))
        assert(tagOf(stored) === hasher.tag(r))
        if (tagged) assert(KeyGroups.tagOf(stored) === hasher.tag(r))
        for (n <- Seq(1, 3, 8, 200)) {
          val refs = ordinals.map(o => BoundReference(o, keySchema(o).dataType, keySchema(o).nullable))
          assert(KeyGroups.owner(tagOf(stored), n) === HashPartitioning(refs, n).partitionIdExpression.eval(r))
        }
        assert(codec.decodeKey(stored) === r)
      }
      spec match {
        case PrefixKeyScanStateEncoderSpec(_, n) =>
          val prefixOf = UnsafeProjection.create(schema.fields.take(n).zipWithIndex.map { case (f, o) =>
            BoundReference(o, f.dataType, f.nullable) }.toSeq)
          (1 until 50).foreach { i =>
            val prefix = codec.encodePrefix(prefixOf(row(i)))
            assert(codec.encodeKey(row(i)).take(prefix.length).sameElements(prefix), "a prefix scan must find the stored key")
          }
        case _ =>
      }
    }
  }

  test("a stored key is never the caller's own row buffer") {
    val keySchema = StructType(Seq(StructField("k", LongType)))
    val codec = new ColumnFamilyCodec("default", "cf", keySchema, StructType(Seq(StructField("v", IntegerType))),
      NoPrefixKeyStateEncoderSpec(keySchema), multipleValues = false, isInternal = false)
    val projection = UnsafeProjection.create(keySchema)
    val first = codec.encodeKey(projection(InternalRow(1L)))
    val firstCopy = first.clone()
    codec.encodeKey(projection(InternalRow(2L))) // the projection reuses its row and buffer
    assert(first.sameElements(firstCopy))
  }
}
