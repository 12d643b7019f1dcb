package io.keyedstate.sinks

import java.time.Duration
import java.util.concurrent.{ConcurrentHashMap, TimeUnit}

import scala.jdk.CollectionConverters._

import org.apache.kafka.clients.producer.KafkaProducer

/**
 * Transactional producers kept between batches, one per transactional id and producer
 * configuration in this JVM, as Flink's Kafka sink recycles its producers: a producer that
 * committed its transaction can begin the next one without a new `initTransactions` (a new
 * producer, a coordinator lookup and a fencing round trip, most of a small batch's cost).
 * A producer is taken out while a transaction uses it and put back only after that transaction
 * committed; one that failed is closed. Whether a producer taken from here was fenced meanwhile
 * (an attempt elsewhere initialised the same id) is checked before any record is sent (see
 * `KafkaTransaction.begin`). A producer left idle for `IdleTimeoutMs` (its query stopped, or its
 * partition moved to another executor) is closed, as Spark's Kafka producer cache does.
 */
object KafkaProducers {
  type Producer = KafkaProducer[Array[Byte], Array[Byte]]

  private final case class Kept(producer: Producer, idleSinceNanos: Long)

  private val idle = new ConcurrentHashMap[(String, Map[String, String]), Kept]()

  /** Enough for a few sinks over the partitions a 2- to 16-core executor runs. */
  val MaxIdle = 64

  /** Spark's Kafka producer cache closes producers idle for 10 minutes; so does this. */
  val IdleTimeoutMs: Long = TimeUnit.MINUTES.toMillis(10)

  /** The clock idle times are measured with; a test seam: only tests replace it. */
  @volatile private[sinks] var nanoTime: () => Long = () => System.nanoTime()

  private def key(settings: KafkaSinkSettings, transactionalId: String) =
    (transactionalId, settings.producerConfig(transactionalId).asScala.toMap)

  /** An idle producer of this id and configuration, taken out, if there is one. */
  def take(settings: KafkaSinkSettings, transactionalId: String): Option[Producer] = {
    closeExpired()
    Option(idle.remove(key(settings, transactionalId))).map(_.producer)
  }

  /**
   * Keeps a producer whose transaction committed for the next one with its id, up to
   * `MaxIdle` producers per JVM (each holds a network thread and its buffers): beyond, it is
   * closed and that id's next transaction makes a new one.
   */
  def putBack(settings: KafkaSinkSettings, transactionalId: String, producer: Producer): Unit = {
    closeExpired()
    if (idle.size >= MaxIdle) producer.close(Duration.ZERO)
    else {
      val replaced = idle.put(key(settings, transactionalId), Kept(producer, nanoTime()))
      // Two attempts of one partition in this JVM (speculation): keep the newer producer only.
      if (replaced != null && (replaced.producer ne producer)) replaced.producer.close(Duration.ZERO)
    }
  }

  /** Tests only: producers kept now. */
  def size: Int = idle.size

  private def closeExpired(): Unit = {
    val now = nanoTime()
    idle.forEach { (k, kept) =>
      val idleMs = TimeUnit.NANOSECONDS.toMillis(now - kept.idleSinceNanos)
      // remove(k, kept): of two threads sweeping at once, only one closes it.
      if (idleMs >= IdleTimeoutMs && idle.remove(k, kept)) kept.producer.close(Duration.ZERO)
    }
  }

  sys.addShutdownHook(idle.values().asScala.foreach(k => k.producer.close(Duration.ZERO)))
}
