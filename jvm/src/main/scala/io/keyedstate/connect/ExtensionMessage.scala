package io.keyedstate.connect

import java.nio.charset.StandardCharsets.UTF_8

import scala.util.control.NonFatal

import org.json4s._
import org.json4s.jackson.JsonMethods

/**
 * A keyedstate relation as a Spark Connect client sends it: a `google.protobuf.Any` whose type
 * URL is `type.googleapis.com/keyedstate.<kind>` and whose value is a JSON object (the input
 * relations inside it are Spark's own `Relation` messages, in base64). Spark passes the plugin
 * the `Any`'s bytes; Spark's protobuf classes are relocated inside its jars, so the two fields
 * of `Any` are read here from the wire format, and keyedstate needs no protobuf of its own.
 */
final case class ExtensionMessage(kind: String, body: JValue)

object ExtensionMessage {
  val TypeUrlPrefix = "type.googleapis.com/keyedstate."

  /** The keyedstate relation in `any`'s bytes; None for another library's extension. */
  def decode(any: Array[Byte]): Option[ExtensionMessage] = {
    val (typeUrl, value) = anyFields(any)
    if (!typeUrl.startsWith(TypeUrlPrefix)) None
    else {
      val kind = typeUrl.stripPrefix(TypeUrlPrefix)
      val body = try JsonMethods.parse(new String(value, UTF_8)) catch {
        case NonFatal(e) => throw new IllegalArgumentException(
          s"keyedstate's Spark Connect relation '$kind' is not JSON: ${e.getMessage}", e)
      }
      Some(ExtensionMessage(kind, body))
    }
  }

  /** `google.protobuf.Any`'s type_url (field 1) and value (field 2); other fields skipped. */
  private def anyFields(bytes: Array[Byte]): (String, Array[Byte]) = {
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
    var typeUrl = ""
    var value = Array.emptyByteArray
    while (at < bytes.length) {
      val tag = varint()
      (tag >>> 3, tag & 7) match {
        case (field, 2) =>
          val length = varint()
          if (length < 0 || length > bytes.length - at) throw malformed
          val content = java.util.Arrays.copyOfRange(bytes, at, at + length.toInt)
          at += length.toInt
          if (field == 1) typeUrl = new String(content, UTF_8)
          else if (field == 2) value = content
        case (_, 0) => varint()
        case (_, 1) => at += 8
        case (_, 5) => at += 4
        case _ => throw malformed
      }
    }
    if (at != bytes.length) throw malformed
    (typeUrl, value)
  }

  private def malformed = new IllegalArgumentException("an extension relation that is not a google.protobuf.Any")

  /** The bytes of an `Any` holding `kind`'s `body` (what the Python client sends; for tests). */
  def encode(kind: String, body: JValue): Array[Byte] = {
    val out = new java.io.ByteArrayOutputStream()
    def varint(v: Long): Unit = {
      var rest = v
      while ((rest & ~0x7fL) != 0) { out.write(((rest & 0x7f) | 0x80).toInt); rest >>>= 7 }
      out.write(rest.toInt)
    }
    def field(number: Int, content: Array[Byte]): Unit = {
      varint((number << 3 | 2).toLong)
      varint(content.length.toLong)
      out.write(content)
    }
    field(1, (TypeUrlPrefix + kind).getBytes(UTF_8))
    field(2, JsonMethods.compact(JsonMethods.render(body)).getBytes(UTF_8))
    out.toByteArray
  }
}
