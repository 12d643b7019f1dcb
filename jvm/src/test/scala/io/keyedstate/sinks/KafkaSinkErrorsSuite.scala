package io.keyedstate.sinks

import java.util.concurrent.ExecutionException

import org.apache.kafka.common.KafkaException
import org.apache.kafka.common.errors.{ProducerFencedException, TimeoutException}
import org.scalatest.funsuite.AnyFunSuite

/** Kafka client failures become one-line `KafkaSinkException`s naming what failed. */
class KafkaSinkErrorsSuite extends AnyFunSuite {
  private val settings = KafkaSinkSettings("out", "b1:9092", "s", None, Map.empty, 3000, 60000,
    batchScope = false)
  private val context = TransactionContext("s", 4, Some(1))

  private def failing(error: Throwable): KafkaSinkException = intercept[KafkaSinkException] {
    KafkaSinkErrors.during("commitTransaction", context, "keyedstate-s-1", settings)(throw error)
  }

  test("a fenced producer, however wrapped, is named a zombie") {
    val wrapped = new KafkaException("Cannot execute transactional method because we are in an " +
      "error state", new ProducerFencedException("There is a newer producer with the same id"))
    val error = failing(wrapped)
    assert(error.getMessage == "[KEYEDSTATE_KAFKA_SINK_FAILED] sink s batch 4 partition 1: commitTransaction on b1:9092 " +
      s"(transactional.id 'keyedstate-s-1', topic 'out') failed: ${KafkaSinkErrors.Fenced}")
    assert(error.getCause eq wrapped)
  }

  test("other failures name their innermost cause, on one line") {
    val error = failing(new ExecutionException(
      new TimeoutException("Timeout expired after 3000ms\nwhile awaiting EndTxn")))
    assert(error.getMessage.endsWith(
      "failed: TimeoutException: Timeout expired after 3000ms"))
    assert(!error.getMessage.contains("\n"))
  }

  test("errors that are not the client's pass through") {
    val bug = new IllegalArgumentException("not a client failure")
    assert(intercept[IllegalArgumentException] {
      KafkaSinkErrors.during("send", context, "id", settings)(throw bug)
    } eq bug)
  }

  test("batch scope's context and transactional id") {
    val batch = TransactionContext("s", 7, None)
    assert(batch.toString == "sink s batch 7")
    assert(settings.transactionalId(batch) == "keyedstate-s-batch")
    assert(settings.transactionalId(context) == "keyedstate-s-1")
  }

  test("the producer's timeouts follow timeout_s unless the config sets them") {
    val props = settings.copy(clientConfig = Map("linger.ms" -> "5")).producerConfig("id")
    assert(props.getProperty("max.block.ms") == "3000")
    assert(props.getProperty("request.timeout.ms") == "3000")
    assert(props.getProperty("delivery.timeout.ms") == "3005") // >= linger + request
    assert(props.getProperty("transactional.id") == "id")
    val own = settings.copy(clientConfig = Map("delivery.timeout.ms" -> "9000")).producerConfig("id")
    assert(own.getProperty("delivery.timeout.ms") == "9000")
    assert(KafkaSinkSettings.seconds(2500) == "2.5" && KafkaSinkSettings.seconds(2000) == "2")
  }

  test("the mark's metadata names its writer, and its query reads back") {
    val metadata = KafkaMarks.metadata(context, Some("q-1"), 12)
    assert(metadata ==
      """{"batch":4,"partition":1,"query":"q-1","records":12,"sink":"s"}""")
    assert(KafkaMarks.queryOf(metadata).contains("q-1"))
    assert(KafkaMarks.queryOf("not json").isEmpty && KafkaMarks.queryOf(null).isEmpty)
  }
}
