package io.keyedstate.service

import java.security.SecureRandom
import java.util.HexFormat

import org.apache.spark.SparkConf

import io.keyedstate.errors.KeyedStateErrors

/**
 * The query service's settings (docs/query-service.md), read from the application's `SparkConf`
 * when the first streaming query starts: whether it runs, the address it binds, the bearer
 * token every request must carry (random per application unless set), and what answers
 * lookups of queryable state: the executors' state servers, or the checkpoint only.
 */
final case class ServiceSettings(enabled: Boolean, host: String, port: Int, token: String,
    lookupsFromCheckpoint: Boolean = false)

object ServiceSettings {
  val Prefix = "spark.keyedstate.service."
  val EnabledKey: String = Prefix + "enabled"
  val HostKey: String = Prefix + "host"
  val PortKey: String = Prefix + "port"
  val TokenKey: String = Prefix + "token"
  val LookupsFromKey: String = Prefix + "lookupsFrom"
  val Keys: Seq[String] = Seq(EnabledKey, HostKey, PortKey, TokenKey, LookupsFromKey)

  /** The loopback address: the service is reachable from this machine only unless told otherwise. */
  val DefaultHost = "127.0.0.1"

  /** A token shorter than this is refused: it guards the savepoint trigger, which writes files. */
  val MinTokenLength = 16

  def from(conf: SparkConf): ServiceSettings = {
    val unknown = conf.getAll.map(_._1).filter(k => k.startsWith(Prefix) && !Keys.contains(k))
    if (unknown.nonEmpty) {
      throw KeyedStateErrors.invalidOption(s"Unknown query service option(s) ${unknown.sorted.mkString(", ")}; " +
        s"allowed: ${Keys.mkString(", ")}")
    }
    val enabled = conf.getOption(EnabledKey).map(_.trim.toLowerCase) match {
      case None | Some("true") => true
      case Some("false") => false
      case Some(other) => throw KeyedStateErrors.invalidOptionValue(EnabledKey, other, "true or false")
    }
    val host = conf.get(HostKey, DefaultHost).trim
    if (host.isEmpty) throw KeyedStateErrors.invalidOptionValue(HostKey, host, "a host name or an IP address")
    val port = conf.getOption(PortKey).map(raw => raw.trim.toIntOption.filter(p => p >= 0 && p <= 65535).getOrElse(
      throw KeyedStateErrors.invalidOptionValue(PortKey, raw, "an integer from 0 (any free port) to 65535")))
      .getOrElse(0)
    val token = conf.getOption(TokenKey).map { raw =>
      if (raw.length < MinTokenLength || raw.exists(c => c.isWhitespace || c.isControl)) {
        throw KeyedStateErrors.invalidOptionValue(TokenKey, "<hidden>",
          s"at least $MinTokenLength characters without spaces")
      }
      raw
    }.getOrElse(randomToken())
    val fromCheckpoint = conf.getOption(LookupsFromKey).map(_.trim.toLowerCase) match {
      case None | Some("executors") => false
      case Some("checkpoint") => true
      case Some(other) => throw KeyedStateErrors.invalidOptionValue(LookupsFromKey, other, "executors or checkpoint")
    }
    ServiceSettings(enabled, host, port, token, fromCheckpoint)
  }

  private def randomToken(): String = {
    val bytes = new Array[Byte](24)
    new SecureRandom().nextBytes(bytes)
    HexFormat.of().formatHex(bytes)
  }
}
