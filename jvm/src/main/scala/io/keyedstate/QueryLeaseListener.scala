package io.keyedstate

import java.util.{Collections, UUID, WeakHashMap}
import java.util.concurrent.{ConcurrentHashMap, Executors}

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path
import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.streaming.StreamingQueryListener
import org.apache.spark.sql.streaming.StreamingQueryListener.{QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent}

import io.keyedstate.checkpoint.StoreLease
import io.keyedstate.shims.SparkTypes.{StreamExecution, StreamingQueryWrapper}

/**
 * Releases a query's store leases ([[StoreLease]]) when it stops, on the driver: Spark closes a
 * stopped query's providers only when its executors' maintenance unloads them (or never, when the
 * session stops first), and until then `keyedstate rescale` from another application would see
 * the query as running. Learns the checkpoint of each query on keyedstate's provider when it
 * starts; removes only the leases of the run that stopped, so a run restarted meanwhile keeps
 * its own. The listing and deletes run on a thread of their own, not on Spark's listener bus.
 */
final class QueryLeaseListener(session: SparkSession) extends StreamingQueryListener with Logging {
  private val stateRoots = new ConcurrentHashMap[UUID, String]()

  override def onQueryStarted(event: QueryStartedEvent): Unit =
    try {
      Option(session.streams.get(event.id)).collect { case w: StreamingQueryWrapper => w.streamingQuery }
        .filter(q => q.runId == event.runId && ownsProvider(q))
        .foreach(q => stateRoots.put(event.runId, new Path(q.resolvedCheckpointRoot, "state").toString))
    } catch {
      case NonFatal(e) => logWarning(s"Cannot learn the checkpoint of query run ${event.runId}: ${e.getMessage}")
    }

  private def ownsProvider(q: StreamExecution): Boolean =
    q.sparkSession.sessionState.conf.getConf(SQLConf.STATE_STORE_PROVIDER_CLASS) ==
      classOf[KeyedStateStoreProvider].getName

  override def onQueryProgress(event: QueryProgressEvent): Unit = ()

  override def onQueryTerminated(event: QueryTerminatedEvent): Unit =
    Option(stateRoots.remove(event.runId)).foreach { root =>
      val hadoopConf = session.sessionState.newHadoopConf()
      QueryLeaseListener.releases.execute { () =>
        try {
          val released = StoreLease.releaseRun(new Path(root), event.runId.toString, hadoopConf)
          if (released > 0) logInfo(s"Released $released store lease(s) of stopped query run ${event.runId} under $root")
        } catch {
          case NonFatal(e) => logWarning(s"Cannot release the store leases of stopped query run ${event.runId} under " +
            s"$root (they go stale in ${StoreLease.StaleAfterMs / 60000} minutes): ${e.getMessage}")
        }
      }
    }
}

object QueryLeaseListener {
  private val installed = Collections.synchronizedMap(new WeakHashMap[SparkSession, java.lang.Boolean]())

  private val releases = Executors.newSingleThreadExecutor { r =>
    val t = new Thread(r, "keyedstate-lease-release")
    t.setDaemon(true)
    t
  }

  /**
   * Installs the listener on `session` once, when a streaming query is analysed in the thread
   * that starts it. Each micro-batch is analysed again in a clone of the session, in the query's
   * own thread (which carries the query id): its queries are the original session's, so nothing
   * is installed there.
   */
  def installOn(session: SparkSession): Unit =
    if (session.sparkContext.getLocalProperty(StreamExecution.QUERY_ID_KEY) == null &&
        installed.putIfAbsent(session, java.lang.Boolean.TRUE) == null) {
      session.streams.addListener(new QueryLeaseListener(session))
    }
}
