package io.keyedstate.sinks

import scala.util.control.NonFatal

import org.apache.kafka.clients.producer.ProducerRecord
import org.slf4j.LoggerFactory

import io.keyedstate.errors.ErrorId

/**
 * One transaction of the Kafka sink, the steps of Flink's `TwoPhaseCommitSinkFunction` (the
 * Python `TwoPhaseCommitSink.write`, run where the rows are): skip it if its mark is there;
 * begin (fencing older attempts); send; pre-commit; commit. A failure before the commit
 * returns aborts and re-raises, so Spark fails (and on restart replays) the batch.
 */
object KafkaTwoPhaseCommit {
  sealed trait Outcome
  case object Committed extends Outcome
  case object Skipped extends Outcome // committed by an earlier attempt: a replay

  private val Log = LoggerFactory.getLogger(getClass)

  def write(settings: KafkaSinkSettings, context: TransactionContext,
      records: Iterator[ProducerRecord[Array[Byte], Array[Byte]]]): Outcome = {
    val marks = new KafkaMarks(settings)
    try {
      if (marks.committedBatch(context, stable = false) >= context.batchId) {
        Log.info(s"$context: already committed, replay skipped")
        Skipped
      } else {
        val transaction = KafkaTransaction.begin(settings, context, marks)
        try {
          try records.foreach(transaction.send)
          catch {
            case bad: InvalidKafkaRecord =>
              throw new KafkaSinkException(s"$context: ${bad.detail}", bad, ErrorId.KafkaInvalidRecord)
          }
          transaction.preCommit()
        } catch {
          case error: Throwable =>
            abortQuietly(transaction, error)
            throw error
        }
        try transaction.commit()
        catch {
          case error: Throwable =>
            // The outcome of a failed commit is unknown: abort what may be left, and the
            // replay reads the mark.
            abortQuietly(transaction, error)
            throw error
        }
        Committed
      }
    } catch {
      case _: BatchAlreadyCommittedException =>
        Log.info(s"$context: committed by another attempt meanwhile, skipped")
        Skipped
    }
  }

  private def abortQuietly(transaction: KafkaTransaction, cause: Throwable): Unit =
    // The failure that led here is the one to report; an abort failing too is only logged.
    try transaction.abort()
    catch {
      case NonFatal(error) =>
        cause.addSuppressed(error)
        Log.warn(s"${transaction.context}: abort failed too", error)
    }
}
