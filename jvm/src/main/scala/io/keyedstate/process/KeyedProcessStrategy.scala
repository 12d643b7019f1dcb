package io.keyedstate.process

import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.execution.{SparkPlan, SparkStrategy}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.streaming.OutputMode

import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateArgumentException}

/**
 * `spark.sql.extensions=io.keyedstate.process.KeyedStateExtensions` (set by
 * `keyedstate.configure`): plans keyed functions, and checks the provider's options on the
 * driver when a streaming query starts, so a bad value fails `start()` with the key, the value
 * and what is allowed, before any task runs.
 */
final class KeyedStateExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    extensions.injectPlannerStrategy(session => new KeyedProcessStrategy(session))
    extensions.injectCheckRule(session => (plan: LogicalPlan) =>
      if (plan.isStreaming) KeyedStateConf.validateSession(session.sessionState.conf.getAllConfs))
  }
}

/** What a keyed function's nodes need from the micro-batch being planned. */
final case class BatchContext(stateInfo: StatefulOperatorStateInfo, batchTimestampMs: Long, watermarkMs: Long)

object KeyedProcessOperators {
  /** Spark numbers its own stateful operators 0..n-1 per query; keyed functions take 1000 + n. */
  val FirstOperatorId = 1000

  val SparkRocksDBProvider = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
  val SupportedProviders: Set[String] = Set(classOf[KeyedStateStoreProvider].getName, SparkRocksDBProvider)

  /**
   * The state info of the keyed function `uid` in the micro-batch being planned on this thread,
   * or None outside a streaming query (`explain` of the streaming DataFrame, say). Operator ids
   * follow the order of keyed functions in the plan, which the same query code reproduces on
   * every run.
   */
  def batchContext(session: SparkSession, uid: String): Option[BatchContext] =
    KeyedProcessSqlBridge.currentIncrementalExecution(session).map { exec =>
      val uids = exec.optimizedPlan.collect { case l: KeyedStateLookup => l.spec.uid }.distinct
      val index = uids.indexOf(uid)
      require(index >= 0, s"keyed function $uid is not in the plan of batch ${exec.currentBatchId}")
      val operatorId = FirstOperatorId + index
      if (exec.outputMode == OutputMode.Complete()) {
        throw new KeyedProcessError(ErrorId.KeyedFunctionCompleteMode,
          "keyed functions emit rows per key and cannot run in Complete output mode; use append or update")
      }
      checkProvider(session.sessionState.conf)
      val info = StatefulOperatorStateInfo(
        exec.checkpointLocation,
        exec.runId,
        operatorId,
        exec.currentBatchId,
        KeyedProcessSqlBridge.numStateStores(exec),
        None,
        exec.currentStateStoreCkptId.get(operatorId))
      BatchContext(info, exec.offsetSeqMetadata.batchTimestampMs, exec.offsetSeqMetadata.batchWatermarkMs)
    }

  /** The eviction watermark Spark propagated to this operator (executed plans only). */
  def inputWatermark(session: SparkSession, context: BatchContext): Long =
    KeyedProcessSqlBridge.currentIncrementalExecution(session)
      .map(_.watermarkPropagator.getInputWatermarkForEviction(context.stateInfo.storeVersion,
        context.stateInfo.operatorId))
      .getOrElse(context.watermarkMs)

  def checkProvider(conf: SQLConf): Unit = {
    val provider = conf.stateStoreProviderClass
    if (!SupportedProviders(provider)) {
      throw new KeyedProcessError(ErrorId.KeyedFunctionUnsupportedProvider,
        s"keyed functions need a state store with column families, multiple values per key, prefix " +
          s"and range scans; the query's provider $provider has none of these. Use " +
          s"${classOf[KeyedStateStoreProvider].getName} (keyedstate.configure sets it) or " +
          s"$SparkRocksDBProvider")
    }
  }

  def isKeyedStateProvider(conf: SQLConf): Boolean =
    conf.stateStoreProviderClass == classOf[KeyedStateStoreProvider].getName
}

/** A clear error with a stable identifier (raised on the driver, before any task runs). */
final class KeyedProcessError(id: ErrorId, detail: String) extends KeyedStateArgumentException(id, detail)

final class KeyedProcessStrategy(session: SparkSession) extends SparkStrategy {
  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case l: KeyedStateLookup =>
      val context = KeyedProcessOperators.batchContext(session, l.spec.uid)
      KeyedStateLookupExec(l.specJson, l.inputSchema, l.output, context, planLater(l.child)) :: Nil
    case a: KeyedStateApply =>
      val context = KeyedProcessOperators.batchContext(session, a.spec.uid)
      KeyedStateApplyExec(a.specJson, a.inputSchema, a.output, context, planLater(a.child)) :: Nil
    case _ => Nil
  }
}
