package io.keyedstate

import java.util.{Collections, UUID, WeakHashMap}
import java.util.concurrent.ConcurrentHashMap

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path
import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.runtime.StreamingQueryWrapper
import org.apache.spark.sql.streaming.StreamingQueryListener
import org.apache.spark.sql.streaming.StreamingQueryListener.{QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent}

import io.keyedstate.checkpoint.StoreLease

/**
 * Releases a query's store leases ([[StoreLease]]) when it stops, on the driver: Spark closes a
 * stopped query's providers only when its executors' maintenance unloads them (or never, when the
 * session stops first), and until then `keyedstate rescale` from another application would see
 * the query as running. Learns each query's checkpoint when it starts; removes only the leases of
 * the run that stopped, so a run restarted meanwhile keeps its own.
 */
final class QueryLeaseListener(session: SparkSession) extends StreamingQueryListener with Logging {
  private val stateRoots = new ConcurrentHashMap[UUID, String]()

  override def onQueryStarted(event: QueryStartedEvent): Unit =
    try {
      Option(session.streams.get(event.id)).collect { case w: StreamingQueryWrapper => w.streamingQuery }
        .filter(_.runId == event.runId)
        .foreach(q => stateRoots.put(event.runId, new Path(q.resolvedCheckpointRoot, "state").toString))
    } catch {
      case NonFatal(e) => logWarning(s"Cannot learn the checkpoint of query run ${event.runId}: ${e.getMessage}")
    }

  override def onQueryProgress(event: QueryProgressEvent): Unit = ()

  override def onQueryTerminated(event: QueryTerminatedEvent): Unit =
    Option(stateRoots.remove(event.runId)).foreach { root =>
      val released = StoreLease.releaseRun(new Path(root), event.runId.toString,
        session.sessionState.newHadoopConf())
      if (released > 0) logInfo(s"Released $released store lease(s) of stopped query run ${event.runId} under $root")
    }
}

object QueryLeaseListener {
  private val installed = Collections.synchronizedMap(new WeakHashMap[SparkSession, java.lang.Boolean]())

  /** Installs the listener on `session` once (called when a streaming query is analyzed). */
  def installOn(session: SparkSession): Unit =
    if (installed.putIfAbsent(session, java.lang.Boolean.TRUE) == null) {
      session.streams.addListener(new QueryLeaseListener(session))
    }
}
