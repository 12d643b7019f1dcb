package io.keyedstate.service

import org.apache.spark.SparkConf
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.errors.{ErrorId, KeyedStateError}

/** The query service's settings: defaults, and a refusal naming the key, the value and what is allowed. */
class ServiceSettingsSuite extends AnyFunSuite {
  private def conf(settings: (String, String)*): SparkConf = new SparkConf(false).setAll(settings)

  test("by default the service runs on loopback, on any free port, with a random token per application") {
    val a = ServiceSettings.from(conf())
    val b = ServiceSettings.from(conf())
    assert((a.enabled, a.host, a.port) == ((true, "127.0.0.1", 0)))
    assert(a.token.length >= ServiceSettings.MinTokenLength && a.token != b.token)
    val set = ServiceSettings.from(conf(ServiceSettings.EnabledKey -> "false", ServiceSettings.PortKey -> "8123",
      ServiceSettings.HostKey -> "0.0.0.0", ServiceSettings.TokenKey -> "0123456789abcdef"))
    assert(set == ServiceSettings(enabled = false, "0.0.0.0", 8123, "0123456789abcdef"))
    assert(!a.lookupsFromCheckpoint)
    assert(ServiceSettings.from(conf(ServiceSettings.LookupsFromKey -> " Checkpoint")).lookupsFromCheckpoint)
    assert(!ServiceSettings.from(conf(ServiceSettings.LookupsFromKey -> "executors")).lookupsFromCheckpoint)
  }

  test("a bad setting is refused with its key, its value and what is allowed; a token is never echoed") {
    def refusal(settings: (String, String)*): String = {
      val e = intercept[IllegalArgumentException](ServiceSettings.from(conf(settings: _*)))
      assert(e.asInstanceOf[KeyedStateError].error == ErrorId.InvalidOption)
      e.getMessage
    }
    val port = refusal(ServiceSettings.PortKey -> "70000")
    assert(port.contains(ServiceSettings.PortKey) && port.contains("70000") && port.contains("0 (any free port) to 65535"))
    val enabled = refusal(ServiceSettings.EnabledKey -> "yes")
    assert(enabled.contains(ServiceSettings.EnabledKey) && enabled.contains("'yes'") && enabled.contains("true or false"))
    val token = refusal(ServiceSettings.TokenKey -> "short secret")
    assert(token.contains(ServiceSettings.TokenKey) && token.contains("at least 16 characters") &&
      !token.contains("short secret"))
    val from = refusal(ServiceSettings.LookupsFromKey -> "driver")
    assert(from.contains(ServiceSettings.LookupsFromKey) && from.contains("'driver'") &&
      from.contains("executors or checkpoint"))
    val unknown = refusal("spark.keyedstate.service.prot" -> "1")
    assert(unknown.contains("spark.keyedstate.service.prot") && unknown.contains(ServiceSettings.PortKey))
  }
}
