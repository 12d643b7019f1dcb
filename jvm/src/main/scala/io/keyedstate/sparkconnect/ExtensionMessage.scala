package io.keyedstate.sparkconnect

import java.nio.charset.StandardCharsets.UTF_8

import scala.collection.mutable.ArrayBuffer
import scala.util.control.NonFatal

import org.json4s._
import org.json4s.jackson.JsonMethods

/**
 * A keyedstate relation as a Spark Connect client sends it: a `google.protobuf.Any` whose type
 * URL is `type.googleapis.com/keyedstate.<kind>` and whose value holds, in the protobuf wire
 * format, a JSON object (field 1) and the input relations it refers to (field 2, repeated:
 * Spark's own `Relation` messages, as bytes; the JSON names each as `{"$relation": <index>}`).
 * Spark passes the plugin the `Any`'s bytes; its protobuf classes are relocated inside its jars,
 * so both are read here from the wire format, and keyedstate needs no protobuf of its own. The
 * inputs stay raw bytes: a chain of keyed functions nests relations in relations, and text
 * encodings would grow with every level.
 */
final case class ExtensionMessage(kind: String, body: JValue, relations: IndexedSeq[Array[Byte]]) {
  /** The input relation `value` names (`{"$relation": i}`); None for a missing or null value. */
  def relationAt(value: JValue): Option[Array[Byte]] = value match {
    case JNothing | JNull => None
    case JObject(List((ExtensionMessage.RelationKey, JInt(i)))) if i >= 0 && i < relations.size =>
      Some(relations(i.toInt))
    case other => throw new IllegalArgumentException(
      s"keyedstate's Spark Connect relation '$kind': ${JsonMethods.compact(other)} names none of its " +
        s"${relations.size} input relations")
  }
}

object ExtensionMessage {
  val TypeUrlPrefix = "type.googleapis.com/keyedstate."
  val RelationKey = "$relation"

  /** The keyedstate relation in `any`'s bytes; None for another library's extension. */
  def decode(any: Array[Byte]): Option[ExtensionMessage] = {
    val fields = lengthDelimited(any, "a google.protobuf.Any")
    val typeUrl = fields.findLast(_._1 == 1).map(f => new String(f._2, UTF_8)).getOrElse("")
    if (!typeUrl.startsWith(TypeUrlPrefix)) None
    else {
      val kind = typeUrl.stripPrefix(TypeUrlPrefix)
      val value = lengthDelimited(fields.findLast(_._1 == 2).map(_._2).getOrElse(Array.emptyByteArray),
        s"keyedstate's relation '$kind'")
      val json = value.findLast(_._1 == 1).map(f => new String(f._2, UTF_8)).getOrElse("")
      val body = try JsonMethods.parse(json) catch {
        case NonFatal(e) => throw new IllegalArgumentException(
          s"keyedstate's Spark Connect relation '$kind' is not JSON: ${e.getMessage}", e)
      }
      Some(ExtensionMessage(kind, body, value.collect { case (2, bytes) => bytes }.toIndexedSeq))
    }
  }

  /**
   * The length-delimited fields of a protobuf message, (field number, bytes), in their order;
   * varint and fixed-width fields are skipped, groups refused.
   */
  private def lengthDelimited(bytes: Array[Byte], what: String): Seq[(Int, Array[Byte])] = {
    def malformed = new IllegalArgumentException(s"an extension relation that is not $what")
    var at = 0
    def varint(): Long = {
      var result = 0L
      var shift = 0
      var more = true
      while (more) {
        if (at >= bytes.length || shift > 63) throw malformed
        val b = bytes(at)
        at += 1
        result |= (b & 0x7fL) << shift
        shift += 7
        more = (b & 0x80) != 0
      }
      result
    }
    val out = ArrayBuffer[(Int, Array[Byte])]()
    while (at < bytes.length) {
      val tag = varint()
      (tag >>> 3, tag & 7) match {
        case (field, 2) =>
          val length = varint()
          if (length < 0 || length > bytes.length - at) throw malformed
          out += field.toInt -> java.util.Arrays.copyOfRange(bytes, at, at + length.toInt)
          at += length.toInt
        case (_, 0) => varint()
        case (_, 1) => at += 8
        case (_, 5) => at += 4
        case _ => throw malformed
      }
    }
    if (at != bytes.length) throw malformed
    out.toSeq
  }
}
