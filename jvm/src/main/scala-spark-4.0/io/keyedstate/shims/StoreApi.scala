package io.keyedstate.shims

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{ReadStateStore, StateStore, StateStoreConf, StateStoreCustomMetric, StateStoreId, StateStoreMetrics}

/** Spark's store API as Spark 4.0 has it (see scala-spark-4.1+): 4.0 lacks what 4.1 added. */
object StoreApi {
  /** 4.0's read stores are given back with `abort` (keyedstate's releases its read store there too). */
  def release(store: ReadStateStore): Unit = store.abort()

  /**
   * 4.0's stores have no `putList`: keyedstate's own has; Spark's write a list as its first
   * value put, then the others merged, which is how 4.0's list state writes one.
   */
  def putList(store: StateStore, key: UnsafeRow, values: Array[UnsafeRow], family: String): Unit = store match {
    case ours: StoreShim => ours.putList(key, values, family)
    case other =>
      other.put(key, values.head, family)
      values.iterator.drop(1).foreach(other.merge(key, _, family))
  }

  /** 4.0's driver validates no commits. */
  def reportCommit(conf: StateStoreConf, version: Long, id: StateStoreId, hadoopConf: Configuration): Unit = ()

  /** 4.0 has no instance metrics: only the store's own. */
  def metrics(numKeys: Long, memoryBytes: Long, custom: Map[StateStoreCustomMetric, Long], id: StateStoreId,
              lastSnapshotUploaded: Long): StateStoreMetrics =
    StateStoreMetrics(numKeys, memoryBytes, custom)
}
