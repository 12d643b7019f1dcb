package org.apache.spark.sql.execution.streaming.state

import org.apache.spark.SparkEnv

/** keyedstate's uses of the coordinator's `private[sql]` API (see scala-spark-4.1+): Spark 4.0's tracks no snapshot uploads. */
object KeyedStateCoordinatorBridge {
  /** Whether the coordinator knows `providerId` as an active instance (its query runs). */
  def isActive(providerId: StateStoreProviderId, executorId: String): Boolean =
    Option(SparkEnv.get).exists { env =>
      StateStoreCoordinatorRef.forExecutor(env).verifyIfInstanceActive(providerId, executorId)
    }

  def snapshotUploaded(providerId: StateStoreProviderId, version: Long, timestampMs: Long): Unit = ()
}
