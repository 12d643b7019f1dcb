package io.keyedstate.sinks

import java.util.concurrent.{ExecutionException, TimeoutException => JavaTimeout}

import org.apache.kafka.common.KafkaException
import org.apache.kafka.common.errors.{InvalidProducerEpochException, ProducerFencedException}

import io.keyedstate.errors.{ErrorId, KeyedStateRuntimeException}

/** A Kafka sink cannot write; the message is one line naming what failed (Python maps it to
 * `KafkaSinkError` with this message). */
final class KafkaSinkException(detail: String, cause: Throwable, id: ErrorId)
    extends KeyedStateRuntimeException(id, detail, cause) {
  // Plain constructors, not default arguments: Python builds these through py4j.
  def this(detail: String, cause: Throwable) = this(detail, cause, ErrorId.KafkaSinkFailed)
  def this(detail: String) = this(detail, null, ErrorId.KafkaSinkFailed)
}

/** A signal, not an error: another attempt committed this transaction's context meanwhile. */
final class BatchAlreadyCommittedException(context: TransactionContext)
    extends KeyedStateRuntimeException(ErrorId.KafkaBatchAlreadyCommitted, context.toString)

/** The one place Kafka client failures become `KafkaSinkException`s. */
object KafkaSinkErrors {
  val Fenced: String = "fenced by a newer attempt of the same partition (this attempt is a " +
    "zombie: its records are discarded)"

  /** `body`, with a client failure of `what` reported for `context`'s transaction. */
  def during[T](what: String, context: TransactionContext, transactionalId: String,
      settings: KafkaSinkSettings)(body: => T): T =
    try body
    catch {
      case error @ (_: KafkaException | _: ExecutionException | _: JavaTimeout |
          _: IllegalStateException | _: InterruptedException) =>
        throw new KafkaSinkException(
          s"$context: $what on ${settings.bootstrapServers} (transactional.id " +
            s"'$transactionalId', topic '${settings.topic}') failed: ${why(error)}", error)
    }

  /** Fenced, or the innermost cause as `Class: message`, on one line. */
  def why(error: Throwable): String = if (fenced(error)) Fenced else describe(error)

  def fenced(error: Throwable): Boolean = causes(error).exists {
    case _: ProducerFencedException | _: InvalidProducerEpochException => true
    case _ => false
  }

  def describe(error: Throwable): String = {
    // Wrappers (ExecutionException, KafkaException "...error state") say less than their cause.
    val inner = causes(error).last
    val message = Option(inner.getMessage).map(_.linesIterator.nextOption().getOrElse("")).getOrElse("")
    s"${inner.getClass.getSimpleName}: $message"
  }

  private def causes(error: Throwable): List[Throwable] =
    Iterator.iterate(error)(_.getCause).takeWhile(_ != null).take(20).toList
}
