package io.keyedstate.sinks

import java.time.Duration
import java.util.concurrent.{ExecutionException, ExecutorService, Executors, TimeUnit}
import java.util.concurrent.atomic.AtomicReference

import scala.jdk.CollectionConverters._

import org.apache.kafka.clients.consumer.{ConsumerGroupMetadata, OffsetAndMetadata}
import org.apache.kafka.clients.producer.{Callback, KafkaProducer, ProducerRecord, RecordMetadata}
import org.apache.kafka.common.TopicPartition
import org.apache.kafka.common.errors.TimeoutException
import org.apache.kafka.common.header.internals.RecordHeader
import org.slf4j.LoggerFactory

/**
 * One open Kafka transaction: a producer with its own transactional id, which commits the
 * records together with the batch's mark (`sendOffsetsToTransaction`). Made by `begin`; ends
 * with `commit` or `abort`, which close it.
 */
final class KafkaTransaction private (
    val settings: KafkaSinkSettings,
    val context: TransactionContext,
    producer: KafkaProducer[Array[Byte], Array[Byte]]) {

  val transactionalId: String = settings.transactionalId(context)
  private var sent = 0L
  // The first failed delivery: sends are asynchronous, their failures arrive on the client's
  // I/O thread.
  private val failed = new AtomicReference[Exception]()
  private val onDelivery: Callback = (_: RecordMetadata, error: Exception) =>
    if (error != null) failed.compareAndSet(null, error)

  def records: Long = sent

  def send(record: ProducerRecord[Array[Byte], Array[Byte]]): Unit = {
    during("send")(producer.send(record, onDelivery))
    sent += 1
    if ((sent & 1023) == 0) raiseDeliveryFailure()
  }

  /** One record from Python (py4j): `headers` as [key, value] pairs, or null. */
  def send(key: Array[Byte], value: Array[Byte], partition: Integer,
      headers: java.util.List[java.util.List[AnyRef]]): Unit = {
    val recordHeaders = Option(headers).map(_.asScala.map { pair =>
      new RecordHeader(pair.get(0).asInstanceOf[String], pair.get(1).asInstanceOf[Array[Byte]])
    }.toList.asJava).orNull
    send(new ProducerRecord(settings.topic, partition, key, value,
      recordHeaders.asInstanceOf[java.lang.Iterable[org.apache.kafka.common.header.Header]]))
  }

  /** Flush, then put the mark in the transaction: after this only the commit is left. */
  def preCommit(): Unit = {
    flush()
    raiseDeliveryFailure()
    during("sendOffsetsToTransaction")(sendMark())
  }

  /**
   * `producer.flush()` with a bound. The client's flush waits for every record without one, and
   * a transactional producer whose brokers went away with records unacknowledged never expires
   * them (its sender waits on the transaction coordinator and skips the expiry), so a broker
   * outage would hang the task. The flush runs on `Flusher`; past the delivery timeout (and
   * `timeout`) this closes the producer, which fails the pending records and ends the flush.
   */
  private def flush(): Unit = {
    val flushing: Runnable = () => producer.flush()
    val flushed = KafkaTransaction.Flusher.submit(flushing)
    val boundMs = math.max(settings.deliveryTimeoutMs, settings.timeoutMs.toLong) +
      KafkaTransaction.FlushSlackMs
    try flushed.get(boundMs, TimeUnit.MILLISECONDS)
    catch {
      case _: java.util.concurrent.TimeoutException =>
        close()
        throw new KafkaSinkException(
          s"$context: record(s) not acknowledged by ${settings.bootstrapServers} within " +
            s"${KafkaSinkSettings.seconds(boundMs)}s (topic '${settings.topic}', " +
            s"transactional.id '$transactionalId'): the brokers or the transaction coordinator " +
            "are unreachable; the transaction is abandoned")
      case error: ExecutionException => during("flush")(throw error.getCause)
    }
  }

  /** The batch's mark, with the records sent so far, into the transaction (the last one sent
   * is the one committed). */
  private def sendMark(): Unit = {
    val mark = new OffsetAndMetadata(context.batchId,
      KafkaMarks.metadata(context, settings.queryId, sent))
    producer.sendOffsetsToTransaction(
      Map(new TopicPartition(settings.topic, KafkaMarks.Partition) -> mark).asJava,
      new ConsumerGroupMetadata(transactionalId))
  }

  def commit(): Unit = {
    // A timeout leaves the commit in progress: calling it again is allowed and finds its
    // outcome; anything else is the template's to abort.
    var attempt = 1
    var done = false
    while (!done) {
      try {
        producer.commitTransaction()
        done = true
      } catch {
        case error: TimeoutException if attempt < 3 =>
          KafkaTransaction.Log.warn(s"$context: commitTransaction: ${error.getMessage}; retrying")
          attempt += 1
        case error: Exception => during("commitTransaction")(throw error)
      }
    }
    KafkaTransaction.Log.info(s"$context: committed $sent record(s) to ${settings.topic}")
    KafkaProducers.putBack(settings, transactionalId, producer)
  }

  def abort(): Unit = try during("abortTransaction")(producer.abortTransaction()) finally close()

  /** Without waiting: after a commit nothing is pending, after a failure nothing is wanted. */
  def close(): Unit = producer.close(Duration.ZERO)

  private def raiseDeliveryFailure(): Unit = Option(failed.get).foreach { error =>
    throw new KafkaSinkException(
      s"$context: record(s) not written to topic '${settings.topic}' on " +
        s"${settings.bootstrapServers}: ${KafkaSinkErrors.why(error)}", error)
  }

  private def during[T](what: String)(body: => T): T =
    KafkaSinkErrors.during(what, context, transactionalId, settings)(body)
}

object KafkaTransaction {
  private val Log = LoggerFactory.getLogger(classOf[KafkaTransaction])

  /** Past the delivery timeout, time for the client to report the records it failed. */
  private val FlushSlackMs = 2000L

  /** Runs the flushes that tasks wait on with a bound (daemon threads, made as needed). */
  private val Flusher: ExecutorService = Executors.newCachedThreadPool { (task: Runnable) =>
    val thread = new Thread(task, "keyedstate-kafka-flush")
    thread.setDaemon(true)
    thread
  }

  /**
   * A transaction for `context`: on the producer its id committed with last in this JVM when
   * it still owns the id (see `resumed`), else on a new one (`fresh`).
   */
  def begin(settings: KafkaSinkSettings, context: TransactionContext,
      marks: KafkaMarks): KafkaTransaction = {
    val transactionalId = settings.transactionalId(context)
    KafkaProducers.take(settings, transactionalId)
      .flatMap(resumed(settings, context, _, marks))
      .getOrElse(fresh(settings, context, marks))
  }

  /**
   * A kept producer's next transaction, if the producer still owns its id. The mark goes into
   * the transaction first: that asks the transaction coordinator, which refuses a producer an
   * attempt elsewhere has fenced since (a newer `initTransactions` of the id), before any
   * record is sent. A producer that owns its id has committed every transaction it began, and
   * any older producer of the id is fenced: a read of the committed mark is then current without
   * waiting for pending ones. Throws `BatchAlreadyCommittedException` when it finds the batch
   * done (a replay: rare, so the producer is closed). Anything else failing to begin: the
   * producer is closed and a new one does it all again.
   */
  private def resumed(settings: KafkaSinkSettings, context: TransactionContext,
      producer: KafkaProducers.Producer, marks: KafkaMarks): Option[KafkaTransaction] = {
    val transaction = new KafkaTransaction(settings, context, producer)
    val owned = try {
      producer.beginTransaction()
      transaction.sendMark()
      true
    } catch {
      case scala.util.control.NonFatal(error) =>
        Log.info(s"$context: the kept producer cannot go on (${error.getClass.getSimpleName}); a new one")
        transaction.close()
        false
    }
    if (!owned) None
    else {
      val done = try marks.committedBatch(context, stable = false) >= context.batchId
      catch {
        case error: Throwable =>
          transaction.close()
          throw error
      }
      if (done) {
        transaction.abort() // the empty transaction; the producer is closed
        throw new BatchAlreadyCommittedException(context)
      }
      Some(transaction)
    }
  }

  /**
   * A producer with `context`'s transactional id, in a transaction. Its `initTransactions`
   * fences any older producer with this id and ends that one's transaction: an open one is
   * aborted, one already committing completes first, so the stable read of the mark after it
   * is current. Throws `BatchAlreadyCommittedException` when that read finds the batch done.
   */
  private def fresh(settings: KafkaSinkSettings, context: TransactionContext,
      marks: KafkaMarks): KafkaTransaction = {
    val transactionalId = settings.transactionalId(context)
    val producer = KafkaSinkErrors.during("creating the producer", context, transactionalId,
      settings)(new KafkaProducer[Array[Byte], Array[Byte]](settings.producerConfig(transactionalId)))
    val transaction = new KafkaTransaction(settings, context, producer)
    try {
      transaction.during("initTransactions")(producer.initTransactions())
      if (marks.committedBatch(context, stable = true) >= context.batchId) {
        throw new BatchAlreadyCommittedException(context)
      }
      transaction.during("beginTransaction")(producer.beginTransaction())
      transaction
    } catch {
      case error: Throwable =>
        transaction.close()
        throw error
    }
  }
}
