package io.keyedstate.engine

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.streaming.WriteToStream
import org.apache.spark.sql.execution.{SparkPlan, SparkStrategy}
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.streaming.OutputMode

import io.keyedstate.{KeyedStateStoreProvider, QueryLeaseListener}
import io.keyedstate.checkpoint.OffsetLog
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.shims.SparkTypes.StatefulOperatorStateInfo
import io.keyedstate.shims.SparkVersionCheck

/**
 * `spark.sql.extensions=io.keyedstate.engine.KeyedStateExtensions` (set by
 * `keyedstate.configure`): plans keyed functions, and checks the provider's options on the
 * driver when a streaming query starts, so a bad value fails `start()` with the key, the value
 * and what is allowed, before any task runs; and releases a stopped query's store leases
 * ([[QueryLeaseListener]]).
 */
final class KeyedStateExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    SparkVersionCheck.check()
    extensions.injectPlannerStrategy(session => new KeyedProcessStrategy(session))
    extensions.injectCheckRule(session => (plan: LogicalPlan) =>
      if (plan.isStreaming) {
        KeyedStateConf.validateSession(session.sessionState.conf.getAllConfs)
        QueryLeaseListener.installOn(session)
        plan match {
          case start: WriteToStream =>
            RestoreMapping.checkAtStart(session, start.resolvedCheckpointLocation)
            KeyedProcessOperators.refuseTransformWithState(session, start)
          case _ => ()
        }
      })
  }
}

/**
 * What a keyed function's nodes need from the micro-batch being planned; `firstOfRun`: the first
 * batch of the query's run, where operator state is restored (see [[UnionListRestore]]).
 */
final case class BatchContext(stateInfo: StatefulOperatorStateInfo, batchTimestampMs: Long, watermarkMs: Long,
    firstOfRun: Boolean)

object KeyedProcessOperators {
  /** Spark numbers its own stateful operators 0..n-1 per query; keyed functions take 1000 + n. */
  val FirstOperatorId = 1000

  /** Spark's name of a keyed function's operator (its operator metadata, `state-metadata`). */
  val ShortName = "keyedProcess"

  /**
   * The state info of the keyed function whose plan nodes carry `nodeId`, in the micro-batch
   * being planned on this thread, or None outside a streaming query (`explain` of the streaming
   * DataFrame, say). Operator ids follow the order in which the query applies its keyed
   * functions (a chain's first function is 1000, the next 1001; branches left to right), which
   * the same query code reproduces on every run; each operator's state records the uid and
   * function that wrote it, and a run that puts another function there is refused.
   */
  def batchContext(session: SparkSession, nodeId: String): Option[BatchContext] =
    KeyedProcessSqlBridge.currentIncrementalExecution(session).map { exec =>
      val nodes = inApplicationOrder(exec.optimizedPlan)
      val functions = nodes.map(_.spec)
      val index = functions.indexWhere(_.nodeId == nodeId)
      require(index >= 0, s"keyed function $nodeId is not in the plan of batch ${exec.currentBatchId}")
      functions.flatMap(_.uid).groupBy(identity).collectFirst { case (uid, all) if all.size > 1 =>
        throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionDuplicateUid, s"${all.size} keyed functions of the query " +
          s"have the uid '$uid' (${functions.filter(_.uid.contains(uid)).map(_.functionName).mkString(", ")}): a " +
          "uid names one operator and its state; give each function its own")
      }
      val operatorId = FirstOperatorId + index
      if (exec.outputMode == OutputMode.Complete()) {
        throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionCompleteMode,
          "keyed functions emit rows per key and cannot run in Complete output mode; use append or update")
      }
      checkProvider(session.sessionState.conf)
      // A savepoint restored into this checkpoint: its state goes to these functions first.
      if (exec.isFirstBatch) {
        RestoreMapping.applyIfPending(session, exec.checkpointLocation, KeyedProcessSqlBridge.numStateStores(exec),
          nodes.map(n => n.spec -> n.inputSchema))
      }
      val info = StatefulOperatorStateInfo(
        exec.checkpointLocation,
        exec.runId,
        operatorId,
        exec.currentBatchId,
        KeyedProcessSqlBridge.numStateStores(exec),
        None,
        exec.currentStateStoreCkptId.get(operatorId))
      BatchContext(info, exec.offsetSeqMetadata.batchTimestampMs, exec.offsetSeqMetadata.batchWatermarkMs,
        exec.isFirstBatch)
    }

  /** The keyed functions of a plan, inputs first: children before their parent, left to right. */
  private def inApplicationOrder(plan: LogicalPlan): Seq[KeyedStateLookup] = {
    val below = plan.children.flatMap(inApplicationOrder)
    val here = plan match { case l: KeyedStateLookup => Seq(l); case _ => Nil }
    (below ++ here).distinctBy(_.spec.nodeId)
  }

  /** The eviction watermark Spark propagated to this operator (executed plans only). */
  def inputWatermark(session: SparkSession, context: BatchContext): Long =
    KeyedProcessSqlBridge.currentIncrementalExecution(session)
      .map(_.watermarkPropagator.getInputWatermarkForEviction(context.stateInfo.storeVersion,
        context.stateInfo.operatorId))
      .getOrElse(context.watermarkMs)

  /**
   * Spark's `transformWithState` keeps its state in Spark's RocksDB provider: Spark 4.2 and 4.3
   * refuse other providers when the query plans, 4.0 and 4.1 would run it on keyedstate's untried.
   * One refusal on every version, as the query starts, with the provider it will run with: the
   * one its checkpoint pinned (a restart), else the session's.
   */
  def refuseTransformWithState(session: SparkSession, start: WriteToStream): Unit =
    // By name: the node is TransformWithState, TransformWithStateInPandas or -InPySpark by version.
    start.inputQuery.find(_.nodeName.startsWith("TransformWithState")).foreach { node =>
      val root = new Path(start.resolvedCheckpointLocation)
      val pinned = OffsetLog.lastPinnedConf(root.getFileSystem(session.sessionState.newHadoopConf()), root)
      val key = SQLConf.STATE_STORE_PROVIDER_CLASS.key
      val provider = pinned.flatMap(_.get(key)).getOrElse(session.sessionState.conf.stateStoreProviderClass)
      if (provider == classOf[KeyedStateStoreProvider].getName) {
        throw KeyedStateErrors.badArgument(ErrorId.TransformWithStateProvider,
          s"Spark's ${node.nodeName} keeps its state in Spark's RocksDB provider, and this query's provider is " +
            s"keyedstate's ($key=$provider${if (pinned.isDefined) ", pinned by its checkpoint" else ""}). Use " +
            "keyedstate's keyed functions (keyedstate.key_by(...).process(...)), or run this query in a " +
            s"session with $key=org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
      }
    }

  /**
   * Keyed functions keep their declaration (key columns, each state's kind and type) in every
   * version's manifest, with the state: only keyedstate's provider has one.
   */
  def checkProvider(conf: SQLConf): Unit = {
    val provider = conf.stateStoreProviderClass
    if (provider != classOf[KeyedStateStoreProvider].getName) {
      throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionUnsupportedProvider,
        s"keyed functions keep their state, and the declaration it was written with, in keyedstate's " +
          s"provider; the query's provider is $provider. Set spark.sql.streaming.stateStore.providerClass=" +
          s"${classOf[KeyedStateStoreProvider].getName} (keyedstate.configure sets it)")
    }
  }
}

final class KeyedProcessStrategy(session: SparkSession) extends SparkStrategy {
  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case l: KeyedStateLookup =>
      val context = KeyedProcessOperators.batchContext(session, l.spec.nodeId)
      KeyedStateLookupExec(l.specJson, l.inputSchema, l.output, context, planLater(l.child),
        l.broadcast.map(planLater)) :: Nil
    case a: KeyedStateApply =>
      val context = KeyedProcessOperators.batchContext(session, a.spec.nodeId)
      KeyedStateApplyExec(a.specJson, a.inputSchema, a.output, context, planLater(a.child)) :: Nil
    case _ => Nil
  }
}
