package io.keyedstate.shims

import org.apache.spark.sql.execution.streaming

/** Spark's streaming classes keyedstate uses (see scala-spark-4.1+): Spark 4.0 has them all in `execution.streaming`. */
object SparkTypes {
  type StreamExecution = streaming.StreamExecution
  val StreamExecution: streaming.StreamExecution.type = streaming.StreamExecution
  type StreamingQueryWrapper = streaming.StreamingQueryWrapper
  type IncrementalExecution = streaming.IncrementalExecution
  type MicroBatchExecution = streaming.MicroBatchExecution
  val MicroBatchExecution: streaming.MicroBatchExecution.type = streaming.MicroBatchExecution

  type StatefulOperatorStateInfo = streaming.StatefulOperatorStateInfo
  val StatefulOperatorStateInfo: streaming.StatefulOperatorStateInfo.type =
    streaming.StatefulOperatorStateInfo
  type StatefulOpStateStoreCheckpointInfo = streaming.StatefulOpStateStoreCheckpointInfo
  val StatefulOpStateStoreCheckpointInfo: streaming.StatefulOpStateStoreCheckpointInfo.type =
    streaming.StatefulOpStateStoreCheckpointInfo
  type StateStoreWriter = streaming.StateStoreWriter

  type CheckpointFileManager = streaming.CheckpointFileManager
  val CheckpointFileManager: streaming.CheckpointFileManager.type = streaming.CheckpointFileManager
  type FileContextBasedCheckpointFileManager = streaming.FileContextBasedCheckpointFileManager
}
