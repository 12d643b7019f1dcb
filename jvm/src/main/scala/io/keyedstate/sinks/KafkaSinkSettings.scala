package io.keyedstate.sinks

import java.util.Properties

import scala.jdk.CollectionConverters._

import org.apache.kafka.clients.admin.AdminClientConfig
import org.apache.kafka.clients.producer.ProducerConfig
import org.apache.kafka.common.serialization.ByteArraySerializer

/** One transaction's identity: the same on every replay of the same batch (and partition). */
final case class TransactionContext(sinkId: String, batchId: Long, partitionId: Option[Int]) {
  override def toString: String =
    s"sink $sinkId batch $batchId" + partitionId.fold("")(p => s" partition $p")
}

/**
 * What a Kafka sink writes where, as the Python sink (keyedstate.sinks.kafka) validated it.
 * Serializable: the partition-scope tasks get it in their closure.
 */
final case class KafkaSinkSettings(
    topic: String,
    bootstrapServers: String,
    sinkId: String,
    queryId: Option[String],
    clientConfig: Map[String, String],
    timeoutMs: Int,
    transactionTimeoutMs: Int,
    batchScope: Boolean) {

  /** `keyedstate-<sink id>-<partition>` (`-batch` for batch scope): the same for every attempt
   * at the same partition, so a new attempt fences the old one. Also the mark's group. */
  def transactionalId(context: TransactionContext): String =
    s"${KafkaSinkSettings.IdPrefix}${context.sinkId}-${context.partitionId.fold("batch")(_.toString)}"

  def timeoutText: String = KafkaSinkSettings.seconds(timeoutMs)

  private def linger: Long =
    clientConfig.get(ProducerConfig.LINGER_MS_CONFIG).map(_.toLong).getOrElse(0L)
  private def requestTimeoutMs: Long = clientConfig.get(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG)
    .map(_.toLong).getOrElse(math.min(timeoutMs.toLong, 30000L))

  /** How long a record may take to be acknowledged: a bounded delivery timeout makes a failed
   * record's callback come within about `timeout` when the brokers are gone, instead of the
   * client's 2 minutes. */
  def deliveryTimeoutMs: Long = clientConfig.get(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG)
    .map(_.toLong).getOrElse(math.max(timeoutMs.toLong, linger + requestTimeoutMs))

  def producerConfig(transactionalId: String): Properties = {
    val defaults = Map(
      // Right after a commit the coordinator answers the same id's next transactional request
      // CONCURRENT_TRANSACTIONS until its markers are written (milliseconds); the client's
      // default 100 ms backoff would cost each transaction about that much.
      ProducerConfig.RETRY_BACKOFF_MS_CONFIG -> "10",
      ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG -> requestTimeoutMs.toString,
      ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG -> deliveryTimeoutMs.toString)
    properties(defaults ++ clientConfig ++ Map(
      ProducerConfig.BOOTSTRAP_SERVERS_CONFIG -> bootstrapServers,
      ProducerConfig.TRANSACTIONAL_ID_CONFIG -> transactionalId,
      ProducerConfig.TRANSACTION_TIMEOUT_CONFIG -> transactionTimeoutMs.toString,
      ProducerConfig.MAX_BLOCK_MS_CONFIG -> timeoutMs.toString,
      ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG -> classOf[ByteArraySerializer].getName,
      ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG -> classOf[ByteArraySerializer].getName))
  }

  def adminConfig: Properties = {
    // Only the settings an admin client knows (security, ...): the rest are the producer's.
    val known = AdminClientConfig.configNames().asScala
    properties(clientConfig.filter { case (k, _) => known.contains(k) } ++ Map(
      AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG -> bootstrapServers,
      AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG -> timeoutMs.toString,
      AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG -> timeoutMs.toString))
  }

  private def properties(entries: Map[String, String]): Properties = {
    val props = new Properties()
    entries.foreach { case (k, v) => props.setProperty(k, v) }
    props
  }
}

object KafkaSinkSettings {
  val IdPrefix = "keyedstate-"

  /** From Python (py4j): plain Java types; `queryId` may be null. */
  def create(
      topic: String,
      bootstrapServers: String,
      sinkId: String,
      queryId: String,
      clientConfig: java.util.Map[String, String],
      timeoutMs: Int,
      transactionTimeoutMs: Int,
      scope: String): KafkaSinkSettings =
    KafkaSinkSettings(topic, bootstrapServers, sinkId, Option(queryId), clientConfig.asScala.toMap,
      timeoutMs, transactionTimeoutMs, batchScope = scope == "batch")

  /** 2000 -> "2", 2500 -> "2.5": seconds as the Python side wrote them. */
  def seconds(ms: Long): String = (BigDecimal(ms) / 1000).bigDecimal.stripTrailingZeros.toPlainString
}
