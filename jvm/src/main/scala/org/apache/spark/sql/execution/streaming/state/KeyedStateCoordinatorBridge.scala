package org.apache.spark.sql.execution.streaming.state

import org.apache.spark.SparkEnv

/**
 * keyedstate's one use of a Spark-internal API: telling the state store coordinator that a
 * snapshot is durable (`StateStoreCoordinatorRef.snapshotUploaded` is `private[sql]`; Spark's
 * own providers call it). Kept in Spark's package, and this small, on purpose.
 */
object KeyedStateCoordinatorBridge {
  def snapshotUploaded(providerId: StateStoreProviderId, version: Long, timestampMs: Long): Unit =
    Option(SparkEnv.get).foreach { env =>
      StateStoreCoordinatorRef.forExecutor(env).snapshotUploaded(providerId, version, timestampMs)
    }
}
