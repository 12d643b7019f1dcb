package io.keyedstate.shims

import java.io.InputStream

import net.jpountz.lz4.LZ4BlockInputStream
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, ReadStateStore, RocksDBKeyStateEncoder, StateStore, StateStoreCustomSizeMetric, StateStoreInstanceMetric, StateStoreIterator, StateStoreProvider, UnsafeRowPair}
import org.apache.spark.sql.types.StructType

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/** What keyedstate calls differently on each Spark minor version, for Spark 4.2 (see the 4.3 one). */
object SparkShims {
  val SparkMinor: String = "4.2"

  /** 4.2's size metrics have no `isSnapshot`: a progress sums this one over the partitions. */
  def stateSizeMetric(name: String, desc: String): StateStoreCustomSizeMetric =
    StateStoreCustomSizeMetric(name, desc)

  /** 4.2's read stores cannot be told a column family's encoding: only keyedstate's can. */
  def registerColFamily(store: ReadStateStore, name: String, keySchema: StructType, valueSchema: StructType,
                        spec: KeyStateEncoderSpec, multipleValues: Boolean, internal: Boolean): Unit =
    store match {
      case ours: StoreShim => ours.registerFamily(name, keySchema, valueSchema, spec, multipleValues, internal)
      case other => throw KeyedStateErrors.unsupported(ErrorId.UnsupportedSparkVersion,
        s"Spark 4.2's ${other.getClass.getName} cannot read the column family $name of its checkpoint (Spark 4.3 " +
          "can): read it on Spark 4.3")
    }

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

/** keyedstate's store as each Spark version sees it: Spark 4.2's stores have no `registerColFamily`: keyedstate's own reads call it. */
trait StoreShim extends StateStore {
  /** Tells the store how to decode a column family that may not exist yet. */
  def registerFamily(name: String, keySchema: StructType, valueSchema: StructType, spec: KeyStateEncoderSpec,
                     multipleValues: Boolean, internal: Boolean): Unit

  final def registerColFamily(name: String, keySchema: StructType, valueSchema: StructType,
                                     spec: KeyStateEncoderSpec, multipleValues: Boolean, internal: Boolean): Unit =
    registerFamily(name, keySchema, valueSchema, spec, multipleValues, internal)
}

/** keyedstate's provider as Spark 4.2 runs its maintenance: one call (see the 4.3 one). */
trait ProviderShim extends StateStoreProvider {
  override final def supportedInstanceMetrics: Seq[StateStoreInstanceMetric] = StoreApi.instanceMetrics

  def cleanupMaintenance(): Unit

  override final def doMaintenance(): Unit = cleanupMaintenance()
}
