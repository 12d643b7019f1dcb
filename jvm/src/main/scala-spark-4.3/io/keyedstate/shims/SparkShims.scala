package io.keyedstate.shims

import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, ReadStateStore, StateStore, StateStoreCustomSizeMetric, StateStoreProvider}
import org.apache.spark.sql.types.StructType

/**
 * What keyedstate calls differently on each Spark minor version, for Spark 4.3 (one object per
 * version, in jvm/src/main/scala-spark-<minor>/, with the same members; docs/architecture.md,
 * "Spark versions"). Imports only keyedstate's errors: every other layer may use it.
 */
object SparkShims {
  val SparkMinor: String = "4.3"

  /** A size metric that describes the state, not the batch (4.3's `isSnapshot`). */
  def stateSizeMetric(name: String, desc: String): StateStoreCustomSizeMetric =
    StateStoreCustomSizeMetric(name, desc, isSnapshot = true)

  /** Tells a read store how to decode a column family (which may not exist yet). */
  def registerColFamily(store: ReadStateStore, name: String, keySchema: StructType, valueSchema: StructType,
                        spec: KeyStateEncoderSpec, multipleValues: Boolean, internal: Boolean): Unit =
    store.registerColFamily(name, keySchema, valueSchema, spec, multipleValues, internal)
}

/** keyedstate's store as each Spark version sees it: Spark 4.3's `ReadStateStore.registerColFamily`, which reads call. */
trait StoreShim extends StateStore {
  /** Tells the store how to decode a column family that may not exist yet. */
  def registerFamily(name: String, keySchema: StructType, valueSchema: StructType, spec: KeyStateEncoderSpec,
                     multipleValues: Boolean, internal: Boolean): Unit

  override final def registerColFamily(name: String, keySchema: StructType, valueSchema: StructType,
                                     spec: KeyStateEncoderSpec, multipleValues: Boolean, internal: Boolean): Unit =
    registerFamily(name, keySchema, valueSchema, spec, multipleValues, internal)
}

/** keyedstate's provider as each Spark version runs its maintenance: Spark 4.3 calls snapshot and
 * cleanup maintenance apart (on two thread pools); keyedstate's commits upload their own
 * snapshots in the background, so only the cleanup is left to do here. */
trait ProviderShim extends StateStoreProvider {
  /** Deletes what retention no longer needs (a failure is thrown to Spark, which unloads the store). */
  def cleanupMaintenance(): Unit

  override final def doSnapshotMaintenance(): Unit = ()

  override final def doCleanupMaintenance(): Unit = cleanupMaintenance()

  override final def doMaintenance(): Unit = cleanupMaintenance()
}
