package io.keyedstate.sinks

import org.apache.spark.TaskContext
import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.execution.SQLExecution

/**
 * The Kafka sink's `foreachBatch` body, called from Python (keyedstate.sinks.kafka) with the
 * batch's DataFrame: Spark rows go to the producer without Python in between.
 */
object KafkaSinkWriter {

  /**
   * Write batch `batchId` of `df` exactly once: one transaction per partition, on the
   * executors, or with batch scope one for the whole batch, on the driver (rows streamed a
   * partition at a time). `checkTopic`: first fail fast if the brokers or topic are missing.
   */
  def write(df: DataFrame, batchId: Long, settings: KafkaSinkSettings, checkTopic: Boolean): Unit = {
    val columns = KafkaRecordColumns(df.schema, settings.topic) // before any job or transaction
    if (checkTopic) KafkaTopics.check(settings)
    val execution = df.queryExecution
    if (settings.batchScope) {
      val context = TransactionContext(settings.sinkId, batchId, None)
      val outcome = SQLExecution.withNewExecutionId(execution, Some(s"keyedstate Kafka sink $context")) {
        // Lazy: the batch's jobs run only if the transaction reads the rows.
        val records = execution.executedPlan.executeToIterator().map(columns.record)
        KafkaTwoPhaseCommit.write(settings, context, records)
      }
      // Spark commits a stateful query's state only when the batch's plan ran on every
      // partition: a skipped batch still runs it, without output.
      if (outcome == KafkaTwoPhaseCommit.Skipped) df.write.format("noop").mode("overwrite").save()
    } else {
      val sinkId = settings.sinkId
      SQLExecution.withNewExecutionId(execution, Some(s"keyedstate Kafka sink $sinkId batch $batchId")) {
        execution.toRdd.foreachPartition { rows =>
          val context = TransactionContext(sinkId, batchId, Some(TaskContext.getPartitionId()))
          if (KafkaTwoPhaseCommit.write(settings, context, rows.map(columns.record)) ==
              KafkaTwoPhaseCommit.Skipped) {
            rows.foreach(_ => ()) // the partition's plan must still run to its end (see above)
          }
        }
      }
    }
  }

  /** The last batch id committed for (sink, partition `partitionId`, or the batch with -1). */
  def committedBatch(settings: KafkaSinkSettings, batchId: Long, partitionId: Int): Long = {
    new KafkaMarks(settings).committedBatch(context(settings, batchId, partitionId), stable = false)
  }

  /** A transaction begun on the driver, for Python's step-by-step `begin_transaction`. */
  def begin(settings: KafkaSinkSettings, batchId: Long, partitionId: Int): KafkaTransaction = {
    KafkaTransaction.begin(settings, context(settings, batchId, partitionId), new KafkaMarks(settings))
  }

  def checkTopic(settings: KafkaSinkSettings): Unit = KafkaTopics.check(settings)

  private def context(settings: KafkaSinkSettings, batchId: Long, partitionId: Int) =
    TransactionContext(settings.sinkId, batchId, Some(partitionId).filter(_ >= 0))
}
