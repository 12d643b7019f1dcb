package io.keyedstate.shims

import org.apache.spark.sql.execution.streaming.state.{ReadStateStore, StateStore, StateStoreInstanceMetric}

/** What keyedstate calls differently on each Spark minor version, for Spark 4.1 (see the 4.3 one). */
object SparkShims extends SparkShimsBefore42 {
  val SparkMinor: String = "4.1"
}

/** keyedstate's store as Spark 4.1 sees it (see scala-spark-4.0-4.1). */
trait StoreShim extends StoreShimBefore42

/** keyedstate's provider as Spark 4.1 runs it: 4.1 upgrades a read store without a forced snapshot. */
trait ProviderShim extends ProviderShimBefore42 {
  override final def supportedInstanceMetrics: Seq[StateStoreInstanceMetric] = StoreApi.instanceMetrics

  override final def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long,
                                                  uniqueId: Option[String]): StateStore =
    upgradeReadStoreToWriteStore(readStore, version, uniqueId, forceSnapshotOnCommit = false)
}
