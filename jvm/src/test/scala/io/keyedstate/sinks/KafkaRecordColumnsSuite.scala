package io.keyedstate.sinks

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.util.GenericArrayData
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.scalatest.funsuite.AnyFunSuite

/** The column contract, checked before any write, and rows to records. */
class KafkaRecordColumnsSuite extends AnyFunSuite {
  private val headerType = ArrayType(StructType(Seq(
    StructField("key", StringType), StructField("value", BinaryType))))

  private def refused(schema: StructType): String = {
    val error = intercept[KafkaSinkException](KafkaRecordColumns(schema, "t"))
    assert(error.getMessage == s"[KEYEDSTATE_KAFKA_SINK_FAILED] ${error.detail}")
    error.detail
  }

  test("each column that does not fit is named with its type and what is allowed") {
    val message = refused(StructType(Seq(
      StructField("key", IntegerType), StructField("topic", StringType))))
    assert(message.startsWith("the DataFrame does not fit a Kafka record (unknown column " +
      "'topic'; no 'value' column; column 'key' is int, must be string or binary); it has " +
      "columns key: int, topic: string. Expected: value"))
    assert(refused(StructType(Nil)).contains("no 'value' column); it has columns none."))
    assert(refused(StructType(Seq(StructField("value", StringType),
      StructField("partition", LongType)))).contains("column 'partition' is bigint, must be int"))
  }

  test("a row becomes a record: strings as UTF-8, nulls kept, partition and headers as given") {
    val schema = StructType(Seq(StructField("headers", headerType),
      StructField("value", BinaryType), StructField("partition", IntegerType),
      StructField("key", StringType)))
    val columns = KafkaRecordColumns(schema, "t")
    val header = InternalRow(UTF8String.fromString("trace"), Array[Byte](1, 2))
    val record = columns.record(InternalRow(new GenericArrayData(Array[Any](header)),
      Array[Byte](0, -1), 2, UTF8String.fromString("k")))
    assert(record.topic == "t" && record.partition == 2)
    assert(new String(record.key, "UTF-8") == "k" && record.value.toSeq == Seq[Byte](0, -1))
    assert(record.headers.asScala.map(h => h.key -> h.value.toSeq).toList ==
      List("trace" -> Seq[Byte](1, 2)))

    val bare = columns.record(InternalRow(null, null, null, null))
    assert(bare.key == null && bare.value == null && bare.partition == null)
    assert(bare.headers.toArray.isEmpty)
  }

  test("a header without a key is refused naming the column") {
    val columns = KafkaRecordColumns(StructType(Seq(StructField("value", StringType),
      StructField("headers", headerType))), "t")
    val header = InternalRow(null, Array[Byte](1))
    val error = intercept[InvalidKafkaRecord](columns.record(
      InternalRow(UTF8String.fromString("v"), new GenericArrayData(Array[Any](header)))))
    assert(error.errorId == "KEYEDSTATE_KAFKA_INVALID_RECORD")
    assert(error.getMessage.startsWith("[KEYEDSTATE_KAFKA_INVALID_RECORD] column 'headers' holds a header with a null key"))
  }
}
