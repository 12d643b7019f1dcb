package io.keyedstate.engine

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.execution.streaming.state._

import io.keyedstate.TaskStateStore
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.shims.SparkTypes.StatefulOperatorStateInfo

/**
 * Opens a keyed function's store for one partition, with every column family it uses, after
 * checking the version's declaration against the function's (see [[OperatorDeclaration]]).
 */
private[engine] object StoreAccess {
  def open(
      info: StatefulOperatorStateInfo,
      partition: Int,
      layout: StateLayout,
      declaration: OperatorDeclaration,
      queryable: Boolean,
      storeConf: StateStoreConf,
      hadoopConf: Configuration): TaskStateStore = {
    val providerId = StateStoreProviderId(
      StateStoreId(info.checkpointLocation, info.operatorId, partition, StateStoreId.DEFAULT_STORE_NAME),
      info.queryRunId)
    val checkpointId = info.stateStoreCkptIds.map(_(partition)).flatMap(_.headOption)
    val store = StateStore.get(providerId, layout.keySchema, layout.defaultValueSchema,
      NoPrefixKeyStateEncoderSpec(layout.keySchema), info.storeVersion, checkpointId, None,
      useColumnFamilies = true, storeConf, hadoopConf, useMultipleValuesPerKey = true) match {
      case s: TaskStateStore => s
      case other => // the planner refuses other providers (KeyedProcessOperators.checkProvider)
        other.abort()
        throw new IllegalStateException(s"keyed functions need keyedstate's provider, got ${other.getClass.getName}")
    }
    try {
      if (queryable) store.makeQueryable() // before any write: the loaded version is a committed one
      OperatorDeclaration.checkAndDeclare(store, declaration, info.operatorId, partition)
      layout.families.foreach { f =>
        store.createColFamilyIfAbsent(f.name, f.keySchema, f.valueSchema, f.spec, f.multipleValues,
          isInternal = f.name.startsWith("$"))
      }
    } catch {
      case e: Throwable =>
        store.abort()
        throw e
    }
    store
  }
}

/** Options a keyed function passes to the provider: the TTL of each state variable. */
private[keyedstate] object StoreOptions {
  /**
   * Refuses states whose reads write under Spark's pipelined Python runner
   * (`spark.python.udf.pipelined.enabled`): it runs the lookup, which reads every state, in its
   * writer thread while the apply node writes in the task thread, and a store has one writer
   * (its changelog, its write batch's order). A read writes only with incremental TTL cleanup on
   * every record: TTL updated on read is written back by the apply node (`updateType` is always
   * `OnCreateAndWrite` for the provider, checked here all the same), and families without a
   * declared TTL have none ([[ttlOptions]]).
   */
  def checkPythonRunner(spec: ProcessSpec, operatorId: Long, storeConf: StateStoreConf, pipelined: Boolean): Unit =
    if (pipelined && spec.states.exists(_.ttl.isDefined)) {
      val ttl = KeyedStateConf(storeConf).ttl
      val writingReads = spec.states.filter { v =>
        val c = ttl.forColumnFamily(operatorId, v.columnFamily)
        c.refreshOnRead || (c.enabled && c.cleanupIncrementalEveryRecord && c.cleanupIncrementalSize > 0)
      }
      if (writingReads.nonEmpty) {
        throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionPipelinedRunner,
          s"state ${writingReads.map(v => s"'${v.name}'").mkString(", ")} of keyed function ${spec.functionName} " +
            s"cleans up expired entries on every record, its reads included, and with $PipelinedRunnerKey=true " +
            "Spark reads in the Python writer thread while the task thread writes the same store. Start the " +
            s"session with $PipelinedRunnerKey=false (the default), or use cleanup_incrementally(size, False)")
      }
    }

  val PipelinedRunnerKey = "spark.python.udf.pipelined.enabled"

  /**
   * The provider's `ttl.operator.<id>.columnFamily.<cf>.*` options of every column family a keyed
   * function owns: a TTL'd state's whole declaration, and `duration=none` for the others (states
   * without TTL, timers, the unused default family), so that session-wide `ttl.*` defaults, meant
   * for Spark's operators, neither expire a keyed function's state nor run cleanup in its reads.
   */
  def ttlOptions(states: Seq[StateVar], operatorId: Long): Map[String, String] = {
    def prefix(cf: String) = s"${KeyedStateConf.Prefix}ttl.operator.$operatorId.columnFamily.$cf."
    val declared = states.flatMap { v =>
      v.ttl match {
        case Some(ttl) => ttl.options.map { case (option, value) => prefix(v.columnFamily) + option -> value }
        case None => Seq(prefix(v.columnFamily) + "duration" -> "none")
      }
    }
    val others = Seq(StateLayout.EventTimers, StateLayout.ProcTimers, LocalRocksDB.DefaultColumnFamily)
      .map(cf => prefix(cf) + "duration" -> "none")
    (declared ++ others).toMap
  }
}
