package io.keyedstate.sinks

import java.util.concurrent.TimeUnit

import org.apache.kafka.clients.producer.KafkaProducer
import org.scalatest.BeforeAndAfterEach
import org.scalatest.funsuite.AnyFunSuite

/**
 * The kept producers' bounds, on real (unconnected) producers: nothing here needs a broker, a
 * producer only connects when a transaction starts.
 */
class KafkaProducersSuite extends AnyFunSuite with BeforeAndAfterEach {
  private var now = 0L
  private val settings = KafkaSinkSettings("out", "127.0.0.1:9", "s", None, Map.empty, 3000, 60000,
    batchScope = false)

  override def beforeEach(): Unit = {
    KafkaProducers.nanoTime = () => now
    drain()
  }

  override def afterEach(): Unit = {
    drain()
    KafkaProducers.nanoTime = () => System.nanoTime()
  }

  private def drain(): Unit = {
    now += TimeUnit.MILLISECONDS.toNanos(KafkaProducers.IdleTimeoutMs) // expires every one kept
    KafkaProducers.take(settings, "none")
    assert(KafkaProducers.size == 0)
  }

  private def producer(id: String): KafkaProducers.Producer =
    new KafkaProducer[Array[Byte], Array[Byte]](settings.producerConfig(id))

  private def idleFor(ms: Long): Unit = now += TimeUnit.MILLISECONDS.toNanos(ms)

  test("a producer put back is taken by its id's next transaction, once") {
    val kept = producer("keyedstate-s-0")
    KafkaProducers.putBack(settings, "keyedstate-s-0", kept)
    assert(KafkaProducers.take(settings, "keyedstate-s-1").isEmpty)
    assert(KafkaProducers.take(settings, "keyedstate-s-0").exists(_ eq kept))
    assert(KafkaProducers.take(settings, "keyedstate-s-0").isEmpty)
    kept.close()
  }

  test("a producer idle for the timeout is closed and not handed out") {
    KafkaProducers.putBack(settings, "keyedstate-s-0", producer("keyedstate-s-0"))
    idleFor(KafkaProducers.IdleTimeoutMs - 1)
    KafkaProducers.putBack(settings, "keyedstate-s-1", producer("keyedstate-s-1"))
    assert(KafkaProducers.size == 2)
    idleFor(1)
    assert(KafkaProducers.take(settings, "keyedstate-s-0").isEmpty) // expired, closed
    assert(KafkaProducers.size == 1)
    idleFor(KafkaProducers.IdleTimeoutMs - 2)
    assert(KafkaProducers.take(settings, "keyedstate-s-1").map { p => p.close(); true }.contains(true))
  }

  test("beyond MaxIdle a committed producer is closed, not kept") {
    (0 until KafkaProducers.MaxIdle + 3).foreach { i =>
      KafkaProducers.putBack(settings, s"keyedstate-s-$i", producer(s"keyedstate-s-$i"))
    }
    assert(KafkaProducers.size == KafkaProducers.MaxIdle)
    assert(KafkaProducers.take(settings, s"keyedstate-s-${KafkaProducers.MaxIdle}").isEmpty)
  }
}
