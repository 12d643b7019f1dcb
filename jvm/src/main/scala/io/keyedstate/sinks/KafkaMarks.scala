package io.keyedstate.sinks

import java.util.concurrent.{ExecutionException, TimeUnit, TimeoutException => JavaTimeout}

import scala.util.Try

import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsOptions
import org.apache.kafka.clients.consumer.OffsetAndMetadata
import org.apache.kafka.common.{KafkaException, TopicPartition}
import org.json4s._
import org.json4s.jackson.JsonMethods

/**
 * The "batch N done" marks: the committed offset of the consumer group named like the
 * transactional id, on partition 0 of the output topic (every topic has a partition 0; the
 * broker refuses offsets for partitions that do not exist). The offset is the batch id, its
 * metadata who wrote it. The group has no members and nobody consumes with it.
 */
final class KafkaMarks(settings: KafkaSinkSettings) {
  private val partition = new TopicPartition(settings.topic, KafkaMarks.Partition)

  /**
   * The last batch id committed for `context`'s (sink, partition); -1 if none. `stable`: wait
   * for the group's offsets pending in a transaction to be committed or aborted (KIP-447), so
   * the answer is current; else only marks already committed (a zombie's pending one would
   * make the read wait for its transaction).
   */
  def committedBatch(context: TransactionContext, stable: Boolean): Long = {
    val group = settings.transactionalId(context)
    val mark = try {
      val options = new ListConsumerGroupOffsetsOptions().requireStable(stable)
      KafkaAdmins.of(settings).listConsumerGroupOffsets(group, options)
        .partitionsToOffsetAndMetadata().get(settings.timeoutMs.toLong, TimeUnit.MILLISECONDS)
        .get(partition)
    } catch {
      case error @ (_: ExecutionException | _: JavaTimeout | _: KafkaException) =>
        throw new KafkaSinkException(
          s"$context: cannot read the committed-batch mark of group '$group' from " +
            s"${settings.bootstrapServers} within ${settings.timeoutText}s " +
            s"(${KafkaSinkErrors.describe(error)})", error)
    }
    if (mark == null || mark.offset < 0) -1L
    else {
      checkOwner(mark, context)
      mark.offset
    }
  }

  /**
   * Spark only ever replays its last batch, so a mark past it, or one of another query at it,
   * means the checkpoint was reset or restored, or another query writes with this sink id:
   * skipping would silently drop batches this query never wrote, so refuse.
   */
  private def checkOwner(mark: OffsetAndMetadata, context: TransactionContext): Unit = {
    val owner = KafkaMarks.queryOf(mark.metadata)
    val otherQuery = owner.isDefined && settings.queryId.isDefined && owner != settings.queryId
    if (mark.offset > context.batchId || (mark.offset == context.batchId && otherQuery)) {
      throw new KafkaSinkException(
        s"$context: sink_id '${context.sinkId}' already committed batch ${mark.offset} " +
          s"(query ${owner.getOrElse("unknown")}) on topic '${settings.topic}'; this query " +
          s"(${settings.queryId.getOrElse("unknown")}) would skip batch ${context.batchId} " +
          "without writing it. The checkpoint was reset or restored from an older copy, or " +
          "another query uses this sink_id: give this query its own sink_id, or restart it " +
          "from the checkpoint that wrote the later batch")
    }
  }
}

object KafkaMarks {
  val Partition = 0

  /** The mark's metadata: what wrote it, for the owner check and for people reading groups. */
  def metadata(context: TransactionContext, queryId: Option[String], records: Long): String = {
    val fields = List[(String, JValue)](
      "batch" -> JLong(context.batchId),
      "partition" -> context.partitionId.fold[JValue](JNull)(p => JInt(p)),
      "query" -> queryId.fold[JValue](JNull)(JString(_)),
      "records" -> JLong(records),
      "sink" -> JString(context.sinkId))
    JsonMethods.compact(JsonMethods.render(JObject(fields)))
  }

  def queryOf(metadata: String): Option[String] =
    Try(JsonMethods.parse(Option(metadata).getOrElse("{}")) \ "query").toOption.collect {
      case JString(query) if query.nonEmpty => query
    }
}
