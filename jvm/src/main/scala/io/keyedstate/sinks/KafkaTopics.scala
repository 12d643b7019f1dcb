package io.keyedstate.sinks

import java.time.Duration
import java.util.Collections
import java.util.concurrent.{ExecutionException, TimeUnit, TimeoutException => JavaTimeout}

import org.apache.kafka.clients.admin.Admin
import org.apache.kafka.common.KafkaException
import org.apache.kafka.common.errors.{TimeoutException, UnknownTopicOrPartitionException}

/** Fails fast, naming the servers or the topic, when the brokers are unreachable or the topic
 * does not exist: the sink never creates topics. */
object KafkaTopics {
  def check(settings: KafkaSinkSettings): Unit = {
    val servers = settings.bootstrapServers
    val admin = Admin.create(settings.adminConfig)
    try {
      admin.describeTopics(Collections.singleton(settings.topic)).allTopicNames()
        .get(settings.timeoutMs.toLong, TimeUnit.MILLISECONDS)
    } catch {
      case error @ (_: ExecutionException | _: JavaTimeout | _: KafkaException) =>
        val cause = error match {
          case wrapper: ExecutionException if wrapper.getCause != null => wrapper.getCause
          case other => other
        }
        cause match {
          case _: UnknownTopicOrPartitionException =>
            throw new KafkaSinkException(
              s"Kafka topic '${settings.topic}' does not exist on $servers " +
                s"(${KafkaSinkErrors.describe(cause)}): create it first, e.g. kafka-topics.sh " +
                s"--bootstrap-server $servers --create --topic ${settings.topic} --partitions N; " +
                "the sink does not create topics", error)
          case _: TimeoutException | _: JavaTimeout =>
            throw new KafkaSinkException(
              s"cannot reach Kafka at $servers within ${settings.timeoutText}s " +
                s"(${KafkaSinkErrors.describe(cause)}): check bootstrap_servers, that the " +
                "brokers are up and that this host can connect to them", error)
          case _ =>
            throw new KafkaSinkException(
              s"cannot use Kafka topic '${settings.topic}' on $servers: " +
                KafkaSinkErrors.describe(cause), error)
        }
    } finally admin.close(Duration.ZERO)
  }
}
