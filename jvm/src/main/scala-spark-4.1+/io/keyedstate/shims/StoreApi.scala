package io.keyedstate.shims

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{ReadStateStore, StateStore, StateStoreConf, StateStoreCustomMetric, StateStoreId, StateStoreInstanceMetric, StateStoreMetrics, StateStoreSnapshotLastUploadInstanceMetric}

/**
 * Spark's store API as it has been since Spark 4.1: releasing read stores, writing lists,
 * commit validation and per-instance metrics (Spark 4.0 has none of them, see scala-spark-4.0).
 */
object StoreApi {
  /** Gives a read store back to its provider. */
  def release(store: ReadStateStore): Unit = store.release()

  /** Writes a key's whole list into any provider's store. */
  def putList(store: StateStore, key: UnsafeRow, values: Array[UnsafeRow], family: String): Unit =
    store.putList(key, values, family)

  /**
   * Tells the driver that store `id` committed `version`: Spark checks that every partition's
   * store committed the batch (spark.sql.streaming.stateStore.commitValidation.enabled).
   */
  def reportCommit(conf: StateStoreConf, version: Long, id: StateStoreId, hadoopConf: Configuration): Unit =
    if (conf.commitValidationEnabled) StateStore.reportCommitToCoordinator(version, id, hadoopConf)

  /** `SnapshotLastUploaded.partition_<p>_<store>`: the last version whose snapshot a store made durable. */
  val SnapshotLastUploaded: StateStoreInstanceMetric = StateStoreSnapshotLastUploadInstanceMetric()

  val instanceMetrics: Seq[StateStoreInstanceMetric] = Seq(SnapshotLastUploaded)

  /** A store's metrics, with its instance metric (-1 before its first snapshot upload). */
  def metrics(numKeys: Long, memoryBytes: Long, custom: Map[StateStoreCustomMetric, Long], id: StateStoreId,
              lastSnapshotUploaded: Long): StateStoreMetrics =
    StateStoreMetrics(numKeys, memoryBytes, custom,
      Map(SnapshotLastUploaded.withNewId(id.partitionId, id.storeName) -> lastSnapshotUploaded))
}
