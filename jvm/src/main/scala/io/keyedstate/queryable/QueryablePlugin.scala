package io.keyedstate.queryable

import java.util.{Map => JMap, UUID}
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.spark.{SparkContext, SparkEnv}
import org.apache.spark.api.plugin.{DriverPlugin, ExecutorPlugin, PluginContext, SparkPlugin}
import org.apache.spark.internal.Logging
import org.apache.spark.scheduler.{SparkListener, SparkListenerExecutorRemoved}

import io.keyedstate.{CommittedViews, StorePartition}

/** What an executor tells the driver about its state server (Spark's plugin messages). */
sealed trait StateServerMessage extends Serializable
final case class ServerStarted(executorId: String, url: String) extends StateServerMessage
final case class PartitionHeld(executorId: String, partition: StorePartition, runId: String, version: Long)
    extends StateServerMessage
final case class PartitionReleased(executorId: String, partition: StorePartition, runId: String)
    extends StateServerMessage

/**
 * Queryable state's Spark plugin (`spark.plugins=io.keyedstate.queryable.QueryablePlugin`, set
 * by `keyedstate.configure`): a [[StateServer]] in every executor, and on the driver the
 * [[StateServers]] directory the proxy routes by, kept up to date by the executors' messages.
 */
final class QueryablePlugin extends SparkPlugin {
  override def driverPlugin(): DriverPlugin = new QueryablePlugin.Driver
  override def executorPlugin(): ExecutorPlugin = new QueryablePlugin.Executor
}

object QueryablePlugin extends Logging {
  val ClassName: String = classOf[QueryablePlugin].getName
  private val TokenKey = "token"

  private final class Driver extends DriverPlugin {
    override def init(sc: SparkContext, ctx: PluginContext): JMap[String, String] = {
      val token = UUID.randomUUID().toString + UUID.randomUUID().toString
      StateServers.started(sc, token)
      sc.addSparkListener(new SparkListener {
        override def onExecutorRemoved(removed: SparkListenerExecutorRemoved): Unit =
          StateServers.executorLost(removed.executorId)
      })
      Map(TokenKey -> token).asJava
    }

    override def receive(message: Any): AnyRef = {
      message match {
        case ServerStarted(executor, url) => StateServers.serverStarted(executor, url)
        case PartitionHeld(executor, partition, runId, version) => StateServers.held(executor, partition, runId, version)
        case PartitionReleased(executor, partition, runId) => StateServers.released(executor, partition, runId)
        case other => logWarning(s"keyedstate: unknown plugin message $other")
      }
      null
    }

    override def shutdown(): Unit = StateServers.stopped()
  }

  private final class Executor extends ExecutorPlugin {
    @volatile private var server: StateServer = _
    private var failed = false
    @volatile private var listener: CommittedViews.Listener = _

    override def init(ctx: PluginContext, extraConf: JMap[String, String]): Unit = {
      val token = extraConf.asScala(TokenKey)
      val executorId = ctx.executorID()
      listener = new CommittedViews.Listener {
        // The driver's own copies of checkpoints (local mode's executor is in its JVM) are not served.
        override def held(p: StorePartition, runId: String, version: Long): Unit =
          if (!CheckpointViews.isCheckpointRun(runId) && started(ctx, token)) send(ctx, PartitionHeld(executorId, p, runId, version))
        override def released(p: StorePartition, runId: String): Unit =
          if (!CheckpointViews.isCheckpointRun(runId)) send(ctx, PartitionReleased(executorId, p, runId))
      }
      CommittedViews.addListener(listener)
      CommittedViews.partitions.foreach { case (p, run) =>
        CommittedViews.versions(p, run).lastOption.foreach(v => listener.held(p, run, v))
      }
    }

    /**
     * Whether the server runs, started with the first queryable partition this executor holds (an
     * application without queryable state opens no port): on the executor's host, where the
     * driver reaches it, and told to the driver before any partition is. An executor whose server
     * cannot start runs on; lookups of its partitions fail.
     */
    private def started(ctx: PluginContext, token: String): Boolean = synchronized {
      if (server == null && !failed) {
        try {
          server = new StateServer(executorHost, token)
          send(ctx, ServerStarted(ctx.executorID(), server.url))
          logInfo(s"keyedstate state server of executor ${ctx.executorID()} at ${server.url}")
        } catch {
          case NonFatal(e) =>
            failed = true
            logWarning(s"keyedstate: no state server in executor ${ctx.executorID()}", e)
        }
      }
      server != null
    }

    /**
     * The host the executor is known by: its block manager's (the driver reaches its blocks
     * there). `PluginContext.hostname` fails in executors, whose RPC environment has no address.
     */
    private def executorHost: String =
      Option(SparkEnv.get).flatMap(e => Option(e.blockManager)).flatMap(b => Option(b.blockManagerId))
        .map(_.host).orElse(sys.env.get("SPARK_LOCAL_IP"))
        .getOrElse(java.net.InetAddress.getLocalHost.getHostAddress)

    private def send(ctx: PluginContext, m: StateServerMessage): Unit =
      try ctx.send(m) catch { case NonFatal(e) => logWarning(s"keyedstate: cannot tell the driver $m", e) }

    override def shutdown(): Unit = synchronized {
      if (listener != null) CommittedViews.removeListener(listener)
      if (server != null) server.close()
    }
  }
}

/**
 * On the driver: each executor's state server and the store partitions whose committed views it
 * holds, as the executors report them (the proxy's routing table, Flink's `KvStateLocationRegistry`).
 */
object StateServers {
  @volatile private var internalToken: Option[String] = None
  @volatile private var context: Option[SparkContext] = None
  private val servers = new ConcurrentHashMap[String, String]()
  // Per partition and query run, the executor holding its newest version (the last to report it
  // on a tie: a retried attempt's commit after a failed attempt's).
  private final case class Holder(executorId: String, version: Long)
  private val holders = new ConcurrentHashMap[(StorePartition, String), Holder]()

  private[queryable] def started(sc: SparkContext, token: String): Unit = {
    context = Some(sc)
    internalToken = Some(token)
  }

  private[queryable] def stopped(): Unit = {
    context = None
    internalToken = None
    servers.clear()
    holders.clear()
  }

  /** The token the executors' servers require, when the plugin runs in this application. */
  def token(sc: SparkContext): Option[String] = if (context.contains(sc)) internalToken else None

  private[queryable] def serverStarted(executor: String, url: String): Unit = servers.put(executor, url)

  private[queryable] def held(executor: String, p: StorePartition, runId: String, version: Long): Unit =
    holders.compute((p, runId), (_, before) =>
      if (before == null || version >= before.version || before.executorId == executor) Holder(executor, version)
      else before)

  private[queryable] def released(executor: String, p: StorePartition, runId: String): Unit =
    holders.computeIfPresent((p, runId), (_, h) => if (h.executorId == executor) null else h)

  private[queryable] def executorLost(executor: String): Unit = {
    servers.remove(executor)
    holders.values().removeIf(_.executorId == executor)
  }

  /** The executor holding the views of `p` published by run `runId`, and its server's URL, if one reported them. */
  def holder(p: StorePartition, runId: String): Option[(String, String)] =
    Option(holders.get((p, runId))).flatMap(h => Option(servers.get(h.executorId)).map(h.executorId -> _))
}
