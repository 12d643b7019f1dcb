package io.keyedstate.sinks

import java.nio.charset.StandardCharsets.UTF_8

import org.apache.kafka.clients.producer.ProducerRecord
import org.apache.kafka.common.header.Header
import org.apache.kafka.common.header.internals.RecordHeader
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.types.{StringType, StructType}

import io.keyedstate.errors.{ErrorId, KeyedStateRuntimeException}

/** A row that cannot be a Kafka record; the transaction's template says which transaction. */
final class InvalidKafkaRecord(detail: String) extends KeyedStateRuntimeException(ErrorId.KafkaInvalidRecord, detail)

/**
 * Where a DataFrame's Kafka columns are, checked before any write, and how one of its rows
 * becomes a record: Spark's own Kafka sink's columns, its `topic` column aside (one topic per
 * sink). Serializable: the tasks get it in their closure.
 */
final case class KafkaRecordColumns private (
    topic: String,
    value: Int,
    valueIsString: Boolean,
    key: Int, // -1: none
    keyIsString: Boolean,
    partition: Int,
    headers: Int) {

  def record(row: InternalRow): ProducerRecord[Array[Byte], Array[Byte]] = {
    val recordPartition =
      if (partition < 0 || row.isNullAt(partition)) null else Int.box(row.getInt(partition))
    new ProducerRecord(topic, recordPartition, bytes(row, key, keyIsString),
      bytes(row, value, valueIsString), recordHeaders(row))
  }

  // UTF8String.getBytes and UnsafeRow.getBinary copy: the producer may keep the arrays.
  private def bytes(row: InternalRow, ordinal: Int, isString: Boolean): Array[Byte] =
    if (ordinal < 0 || row.isNullAt(ordinal)) null
    else if (isString) row.getUTF8String(ordinal).getBytes
    else row.getBinary(ordinal)

  private def recordHeaders(row: InternalRow): java.lang.Iterable[Header] =
    if (headers < 0 || row.isNullAt(headers)) null
    else {
      val array = row.getArray(headers)
      val out = new java.util.ArrayList[Header](array.numElements())
      for (i <- 0 until array.numElements() if !array.isNullAt(i)) {
        val header = array.getStruct(i, 2)
        if (header.isNullAt(0)) {
          throw new InvalidKafkaRecord(
            s"column 'headers' holds a header with a null key (value " +
              s"${Option(header.getBinary(1)).map(new String(_, UTF_8)).getOrElse("null")}): " +
              "a Kafka header needs a key")
        }
        out.add(new RecordHeader(header.getUTF8String(0).toString, header.getBinary(1)))
      }
      out
    }
}

object KafkaRecordColumns {
  val Allowed: Seq[(String, Seq[String])] = Seq(
    "key" -> Seq("string", "binary"),
    "value" -> Seq("string", "binary"),
    "partition" -> Seq("int"),
    "headers" -> Seq("array<struct<key:string,value:binary>>"))

  /** The columns of `schema`, or a `KafkaSinkException` naming each column that does not fit. */
  def apply(schema: StructType, topic: String): KafkaRecordColumns = {
    val allowed = Allowed.toMap
    val types = schema.fields.map(f => f.name -> f.dataType.simpleString).toSeq
    val problems =
      types.collect { case (name, _) if !allowed.contains(name) => s"unknown column '$name'" } ++
        (if (types.exists(_._1 == "value")) Nil else Seq("no 'value' column")) ++
        types.collect {
          case (name, kind) if allowed.get(name).exists(!_.contains(kind)) =>
            s"column '$name' is $kind, must be ${allowed(name).mkString(" or ")}"
        }
    if (problems.nonEmpty) {
      val columns = if (types.isEmpty) "none" else types.map { case (n, t) => s"$n: $t" }.mkString(", ")
      throw new KafkaSinkException(
        s"the DataFrame does not fit a Kafka record (${problems.mkString("; ")}); it has columns " +
          s"$columns. Expected: value (string or binary), optional key (string or binary), " +
          "partition (int), headers (array<struct<key:string,value:binary>>): select or cast, " +
          "e.g. df.selectExpr('CAST(id AS STRING) AS key', 'to_json(struct(*)) AS value')")
    }
    def ordinal(name: String): Int = schema.fieldNames.indexOf(name)
    def isString(name: String): Boolean =
      schema.find(_.name == name).exists(_.dataType.isInstanceOf[StringType])
    KafkaRecordColumns(topic, ordinal("value"), isString("value"), ordinal("key"),
      isString("key"), ordinal("partition"), ordinal("headers"))
  }
}
