package org.apache.spark.sql.execution.streaming.state

import org.apache.spark.SparkEnv

/**
 * keyedstate's uses of Spark-internal APIs: telling the state store coordinator that a snapshot
 * is durable (`StateStoreCoordinatorRef.snapshotUploaded` is `private[sql]`; Spark's own
 * providers call it) and asking it whether a store instance's query still runs. Kept in Spark's
 * package, and this small, on purpose; one per Spark version (4.0's tracks no uploads).
 */
object KeyedStateCoordinatorBridge {
  /** Whether the coordinator knows `providerId` as an active instance (its query runs). */
  def isActive(providerId: StateStoreProviderId, executorId: String): Boolean =
    Option(SparkEnv.get).exists { env =>
      StateStoreCoordinatorRef.forExecutor(env).verifyIfInstanceActive(providerId, executorId)
    }

  def snapshotUploaded(providerId: StateStoreProviderId, version: Long, timestampMs: Long): Unit =
    Option(SparkEnv.get).foreach { env =>
      StateStoreCoordinatorRef.forExecutor(env).snapshotUploaded(providerId, version, timestampMs)
    }
}
