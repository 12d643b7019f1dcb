package io.keyedstate.queryable

import java.time.{Instant, LocalDate, LocalDateTime, OffsetDateTime, ZoneOffset}
import java.time.format.DateTimeParseException
import java.util.Base64

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters
import org.apache.spark.sql.catalyst.util.{ArrayBasedMapData, ArrayData, GenericArrayData}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.json4s._

/**
 * Spark values as lookups exchange them in JSON (docs/queryable-state.md, "Values in JSON"), both
 * ways: keys parsed into Spark's internal form, stored values written out. A value that does not
 * fit its type is refused with the path of the value, what it is and what the type allows.
 *
 * Strings, booleans and integral numbers are JSON's; floating-point numbers too, NaN and the
 * infinities as the strings `"NaN"`, `"Infinity"` and `"-Infinity"`; decimals as strings (exact);
 * dates as `"YYYY-MM-DD"`; timestamps as ISO-8601 with an offset (written in UTC, `Z`); timestamps
 * without time zone as ISO-8601 without one; binary as base64; structs as objects by field name
 * (or arrays by position, for keys); arrays as arrays; maps as arrays of `[key, value]` pairs.
 */
object JsonValues {

  /** A key or value that does not fit its type. */
  final class BadValue(message: String) extends IllegalArgumentException(message)

  private def bad(path: String, v: JValue, dt: DataType): Nothing = {
    val shown = org.json4s.jackson.JsonMethods.compact(v).take(80)
    throw new BadValue(s"$path is $shown, not a ${dt.simpleString} (${allowed(dt)})")
  }

  private def allowed(dt: DataType): String = dt match {
    case StringType => "a JSON string"
    case BooleanType => "true or false"
    case ByteType | ShortType | IntegerType | LongType => s"a JSON integer in the range of ${dt.simpleString}"
    case FloatType | DoubleType => "a JSON number, or \"NaN\", \"Infinity\", \"-Infinity\""
    case _: DecimalType => "a decimal as a string or a number"
    case DateType => "a string YYYY-MM-DD"
    case TimestampType => "an ISO-8601 string with an offset, e.g. 2026-11-28T10:15:30.5Z"
    case TimestampNTZType => "an ISO-8601 string without an offset, e.g. 2026-11-28T10:15:30.5"
    case BinaryType => "a base64 string"
    case s: StructType => s"an object with fields ${s.fieldNames.mkString(", ")}, or an array of ${s.length} values"
    case _: ArrayType => "a JSON array"
    case _: MapType => "an array of [key, value] pairs"
    case other => s"${other.simpleString} is not supported"
  }

  /**
   * `v` as a Spark internal value of type `dt` (null for JSON null); `path` names it in errors.
   * Nothing is rounded or truncated: a value the type cannot hold exactly is refused.
   */
  def toInternal(v: JValue, dt: DataType, path: String): Any =
    try internal(v, dt, path) catch {
      case e: BadValue => throw e
      case _: ArithmeticException | _: java.time.DateTimeException => bad(path, v, dt)
    }

  private def internal(v: JValue, dt: DataType, path: String): Any = (v, dt) match {
    case (JNull | JNothing, _) => null
    case (JString(s), StringType) => UTF8String.fromString(s)
    case (JBool(b), BooleanType) => b
    case (_, ByteType) => integral(v, dt, path, Byte.MinValue, Byte.MaxValue).toByte
    case (_, ShortType) => integral(v, dt, path, Short.MinValue, Short.MaxValue).toShort
    case (_, IntegerType) => integral(v, dt, path, Int.MinValue, Int.MaxValue).toInt
    case (_, LongType) => integral(v, dt, path, Long.MinValue, Long.MaxValue).toLong
    case (_, DoubleType) => floating(v, dt, path)
    case (_, FloatType) => floating(v, dt, path).toFloat
    case (_, d: DecimalType) =>
      val big = v match {
        case JString(s) => try BigDecimal(s) catch { case _: NumberFormatException => bad(path, v, dt) }
        case JInt(i) => BigDecimal(i)
        case JLong(l) => BigDecimal(l)
        case JDecimal(x) => x
        case JDouble(x) => BigDecimal(x)
        case _ => bad(path, v, dt)
      }
      // Exactly: more fractional digits than the scale (rounding would name another key) or
      // more integral digits than the precision allows are refused.
      val exact = big.bigDecimal.stripTrailingZeros()
      if (math.max(exact.scale, 0) > d.scale || exact.precision - exact.scale > d.precision - d.scale) bad(path, v, dt)
      Decimal(big.setScale(d.scale))
    case (JString(s), DateType) =>
      try Math.toIntExact(LocalDate.parse(s).toEpochDay) catch { case _: DateTimeParseException => bad(path, v, dt) }
    case (JString(s), TimestampType) =>
      try micros(OffsetDateTime.parse(s).toInstant, path, v, dt) catch {
        case _: DateTimeParseException => bad(path, v, dt)
      }
    case (JString(s), TimestampNTZType) =>
      try micros(LocalDateTime.parse(s).toInstant(ZoneOffset.UTC), path, v, dt) catch {
        case _: DateTimeParseException => bad(path, v, dt)
      }
    case (JString(s), BinaryType) =>
      try Base64.getDecoder.decode(s) catch { case _: IllegalArgumentException => bad(path, v, dt) }
    case (JObject(fields), s: StructType) =>
      val byName = fields.toMap
      val unknown = byName.keySet -- s.fieldNames
      if (unknown.nonEmpty) {
        throw new BadValue(s"$path has fields ${unknown.toSeq.sorted.mkString(", ")} that ${s.simpleString} does not")
      }
      InternalRow.fromSeq(s.fields.toSeq.map(f => internal(byName.getOrElse(f.name, JNull), f.dataType,
        s"$path.${f.name}")))
    case (JArray(items), s: StructType) =>
      if (items.length != s.length) {
        throw new BadValue(s"$path has ${items.length} values, ${s.simpleString} has ${s.length} fields")
      }
      InternalRow.fromSeq(s.fields.toSeq.zip(items).map { case (f, i) => internal(i, f.dataType, s"$path.${f.name}") })
    case (JArray(items), a: ArrayType) =>
      new GenericArrayData(items.zipWithIndex.map { case (i, n) => internal(i, a.elementType, s"$path[$n]") }.toArray)
    case (JArray(items), m: MapType) =>
      val pairs = items.zipWithIndex.map {
        case (JArray(List(k, x)), n) => (internal(k, m.keyType, s"$path[$n][0]"), internal(x, m.valueType, s"$path[$n][1]"))
        case (other, n) => bad(s"$path[$n]", other, m)
      }
      ArrayBasedMapData(pairs.map(_._1).toArray, pairs.map(_._2).toArray)
    case _ => bad(path, v, dt)
  }

  private def integral(v: JValue, dt: DataType, path: String, min: Long, max: Long): BigInt = {
    val i = v match {
      case JInt(x) => x
      case JLong(x) => BigInt(x)
      case JDecimal(x) if x.isWhole => x.toBigInt
      case JDouble(x) if x.isWhole => BigDecimal(x).toBigInt
      case _ => bad(path, v, dt)
    }
    if (i < min || i > max) bad(path, v, dt)
    i
  }

  private def floating(v: JValue, dt: DataType, path: String): Double = v match {
    case JDouble(x) => x
    case JDecimal(x) => x.toDouble
    case JInt(x) => x.toDouble
    case JLong(x) => x.toDouble
    case JString("NaN") => Double.NaN
    case JString("Infinity") => Double.PositiveInfinity
    case JString("-Infinity") => Double.NegativeInfinity
    case _ => bad(path, v, dt)
  }

  /** Microseconds since the epoch: Spark's precision; a finer instant is refused. */
  private def micros(i: Instant, path: String, v: JValue, dt: DataType): Long = {
    if (i.getNano % 1000 != 0) throw new BadValue(s"$path has a fraction of a second finer than microseconds, " +
      s"which a ${dt.simpleString} cannot hold")
    Math.addExact(Math.multiplyExact(i.getEpochSecond, 1000000L), i.getNano / 1000L)
  }

  private def instant(micros: Long): Instant =
    Instant.ofEpochSecond(Math.floorDiv(micros, 1000000L), Math.floorMod(micros, 1000000L) * 1000L)

  /** Field `i` of type `dt` of `row` (an array's element, a struct's field) as JSON. */
  def toJson(row: SpecializedGetters, i: Int, dt: DataType): JValue =
    if (row.isNullAt(i)) JNull
    else dt match {
      case StringType => JString(row.getUTF8String(i).toString)
      case BooleanType => JBool(row.getBoolean(i))
      case ByteType => JInt(row.getByte(i).toInt)
      case ShortType => JInt(row.getShort(i).toInt)
      case IntegerType => JInt(row.getInt(i))
      case LongType => JLong(row.getLong(i))
      case FloatType => floatJson(row.getFloat(i).toDouble)
      case DoubleType => floatJson(row.getDouble(i))
      case d: DecimalType => JString(row.getDecimal(i, d.precision, d.scale).toJavaBigDecimal.toPlainString)
      case DateType => JString(LocalDate.ofEpochDay(row.getInt(i).toLong).toString)
      case TimestampType => JString(instant(row.getLong(i)).toString)
      case TimestampNTZType => JString(LocalDateTime.ofInstant(instant(row.getLong(i)), ZoneOffset.UTC).toString)
      case BinaryType => JString(Base64.getEncoder.encodeToString(row.getBinary(i)))
      case s: StructType => rowJson(row.getStruct(i, s.length), s)
      case a: ArrayType => arrayJson(row.getArray(i), a.elementType)
      case m: MapType =>
        val map = row.getMap(i)
        val keys = map.keyArray()
        val values = map.valueArray()
        JArray((0 until map.numElements()).toList.map(n =>
          JArray(List(toJson(keys, n, m.keyType), toJson(values, n, m.valueType)))))
      case other => JString(String.valueOf(row.get(i, other)))
    }

  /** A whole row of `schema` as a JSON object. */
  def rowJson(row: SpecializedGetters, schema: StructType): JValue =
    JObject(schema.fields.toList.zipWithIndex.map { case (f, n) => f.name -> toJson(row, n, f.dataType) })

  def arrayJson(a: ArrayData, elementType: DataType): JValue =
    JArray((0 until a.numElements()).toList.map(n => toJson(a, n, elementType)))

  private def floatJson(x: Double): JValue =
    if (x.isNaN) JString("NaN")
    else if (x.isPosInfinity) JString("Infinity")
    else if (x.isNegInfinity) JString("-Infinity")
    else JDouble(x)
}
