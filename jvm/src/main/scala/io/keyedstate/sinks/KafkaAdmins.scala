package io.keyedstate.sinks

import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._

import org.apache.kafka.clients.admin.Admin

/**
 * One admin client per cluster (per admin configuration) and JVM, kept for the JVM's life, as
 * Spark caches its Kafka producers: each transaction reads its mark twice, and a new client
 * per task would pay a connection and a metadata fetch each time. An admin client is
 * thread-safe; its I/O thread is a daemon.
 */
object KafkaAdmins {
  private val admins = new ConcurrentHashMap[Map[String, String], Admin]()

  def of(settings: KafkaSinkSettings): Admin = {
    val config = settings.adminConfig
    val key = config.asScala.toMap
    admins.computeIfAbsent(key, _ => Admin.create(config))
  }
}
