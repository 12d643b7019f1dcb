package io.keyedstate.shims

import java.io.InputStream

import net.jpountz.lz4.LZ4BlockInputStream
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, ReadStateStore, RocksDBKeyStateEncoder, StateStore, StateStoreCustomSizeMetric, StateStoreInstanceMetric, StateStoreIterator, StateStoreProvider, UnsafeRowPair}
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

  /** Opens a writable store; `loadEmpty` starts it empty at `version` (a restore writes it whole). */
  def getStore(provider: StateStoreProvider, version: Long, checkpointId: Option[String],
               forceSnapshotOnCommit: Boolean, loadEmpty: Boolean): StateStore =
    provider.getStore(version, checkpointId, forceSnapshotOnCommit, loadEmpty)

  /** Every provider opens a store empty at any version since Spark 4.2. */
  def checkOpensEmpty(provider: Class[_], version: Long): Unit = ()

  def allColumnFamilyNames(store: ReadStateStore): Set[String] = store.allColumnFamilyNames

  def iteratorWithMultiValues(store: ReadStateStore, family: String): StateStoreIterator[UnsafeRowPair] =
    store.iteratorWithMultiValues(family)

  def supportsRangeScan(spec: KeyStateEncoderSpec, encoder: RocksDBKeyStateEncoder): Boolean =
    encoder.supportsRangeScan

  /** An LZ4 block stream reader (lz4-java 1.10+ builds it; older ones have constructors only). */
  def lz4Input(in: InputStream): InputStream = LZ4BlockInputStream.newBuilder().build(in)
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
  override final def supportedInstanceMetrics: Seq[StateStoreInstanceMetric] = StoreApi.instanceMetrics

  /** Deletes what retention no longer needs (a failure is thrown to Spark, which unloads the store). */
  def cleanupMaintenance(): Unit

  override final def doSnapshotMaintenance(): Unit = ()

  override final def doCleanupMaintenance(): Unit = cleanupMaintenance()

  override final def doMaintenance(): Unit = cleanupMaintenance()
}
