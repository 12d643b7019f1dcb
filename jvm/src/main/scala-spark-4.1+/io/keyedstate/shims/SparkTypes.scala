package io.keyedstate.shims

import org.apache.spark.sql.execution.streaming.{checkpointing, operators, runtime}

/**
 * Spark's streaming classes keyedstate uses, under one name on every Spark version: Spark 4.1
 * moved them into `runtime`, `checkpointing` and `operators.stateful` (4.0 has them in
 * `execution.streaming`, see scala-spark-4.0). The common sources import them from here.
 */
object SparkTypes {
  type StreamExecution = runtime.StreamExecution
  val StreamExecution: runtime.StreamExecution.type = runtime.StreamExecution
  type StreamingQueryWrapper = runtime.StreamingQueryWrapper
  type IncrementalExecution = runtime.IncrementalExecution
  type MicroBatchExecution = runtime.MicroBatchExecution
  val MicroBatchExecution: runtime.MicroBatchExecution.type = runtime.MicroBatchExecution

  type StatefulOperatorStateInfo = operators.stateful.StatefulOperatorStateInfo
  val StatefulOperatorStateInfo: operators.stateful.StatefulOperatorStateInfo.type =
    operators.stateful.StatefulOperatorStateInfo
  type StatefulOpStateStoreCheckpointInfo = operators.stateful.StatefulOpStateStoreCheckpointInfo
  val StatefulOpStateStoreCheckpointInfo: operators.stateful.StatefulOpStateStoreCheckpointInfo.type =
    operators.stateful.StatefulOpStateStoreCheckpointInfo
  type StateStoreWriter = operators.stateful.StateStoreWriter

  type CheckpointFileManager = checkpointing.CheckpointFileManager
  val CheckpointFileManager: checkpointing.CheckpointFileManager.type = checkpointing.CheckpointFileManager
  type FileContextBasedCheckpointFileManager = checkpointing.FileContextBasedCheckpointFileManager
}
