package io.keyedstate.shims

import java.io.InputStream

import net.jpountz.lz4.LZ4BlockInputStream
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, RangeKeyScanStateEncoderSpec, ReadStateStore, RocksDBKeyStateEncoder, StateStore, StateStoreCustomSizeMetric, StateStoreInstanceMetric, StateStoreIterator, StateStoreProvider, UnsafeRowPair}
import org.apache.spark.sql.types.StructType

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * What keyedstate calls differently on each Spark minor version, for Spark 4.1 (see the 4.3 one).
 * 4.1's store API predates 4.2's: its read stores have no column-family listing or list
 * iterators, and its providers open no store empty at a batch. keyedstate's own store has them all;
 * Spark's stores are refused where they would be needed, naming the version that can.
 */
object SparkShims {
  val SparkMinor: String = "4.1"

  /** 4.1's size metrics have no `isSnapshot`: a progress sums this one over the partitions. */
  def stateSizeMetric(name: String, desc: String): StateStoreCustomSizeMetric =
    StateStoreCustomSizeMetric(name, desc)

  private def ours(store: ReadStateStore, what: String): StoreShim = store match {
    case ours: StoreShim => ours
    case other => throw KeyedStateErrors.unsupported(ErrorId.UnsupportedSparkVersion,
      s"Spark 4.1's ${other.getClass.getName} cannot $what of its checkpoint (Spark 4.3 can): read it on Spark 4.3")
  }

  def registerColFamily(store: ReadStateStore, name: String, keySchema: StructType, valueSchema: StructType,
                        spec: KeyStateEncoderSpec, multipleValues: Boolean, internal: Boolean): Unit =
    ours(store, s"read the column family $name").registerFamily(name, keySchema, valueSchema, spec, multipleValues,
      internal)

  def allColumnFamilyNames(store: ReadStateStore): Set[String] =
    ours(store, "list the column families").allColumnFamilyNames

  def iteratorWithMultiValues(store: ReadStateStore, family: String): StateStoreIterator[UnsafeRowPair] =
    ours(store, s"read the lists of the column family $family").iteratorWithMultiValues(family)

  /**
   * Opens a writable store. Spark 4.1's providers take neither `forceSnapshotOnCommit` nor
   * `loadEmpty`: they open a store empty only at version 0 (the HDFS-backed provider's restore
   * starts there, see offline.CheckpointWriter); a restore at a later batch needs keyedstate's.
   */
  def getStore(provider: StateStoreProvider, version: Long, checkpointId: Option[String],
               forceSnapshotOnCommit: Boolean, loadEmpty: Boolean): StateStore = provider match {
    case ours: ProviderShim => ours.getStore(version, checkpointId, forceSnapshotOnCommit, loadEmpty)
    case other =>
      if (loadEmpty) checkOpensEmpty(other.getClass, version)
      other.getStore(version, checkpointId)
  }

  /** Refuses, before anything is written, a store of `provider` opened empty at `version`. */
  def checkOpensEmpty(provider: Class[_], version: Long): Unit =
    if (version > 0 && !classOf[ProviderShim].isAssignableFrom(provider)) {
      throw KeyedStateErrors.unsupported(ErrorId.UnsupportedSparkVersion,
        s"Spark 4.1's ${provider.getName} cannot open an empty store at batch $version (getStore's loadEmpty " +
          "is new in Spark 4.2): restore into keyedstate's provider, or run the restore on Spark 4.2 or later")
    }

  /** 4.1's key encoders cannot say: only the range-scan spec scans ranges there. */
  def supportsRangeScan(spec: KeyStateEncoderSpec, encoder: RocksDBKeyStateEncoder): Boolean =
    spec.isInstanceOf[RangeKeyScanStateEncoderSpec]

  /** lz4-java 1.8 (Spark 4.1's) has constructors only; the streams are the same bytes. */
  def lz4Input(in: InputStream): InputStream = new LZ4BlockInputStream(in)
}

/**
 * keyedstate's store as Spark 4.1 sees it: 4.1's `ReadStateStore` and `StateStore` lack the
 * members declared here (new in 4.2 and 4.3), which keyedstate's store implements all the same,
 * for its own operators and readers.
 */
trait StoreShim extends StateStore {
  /** Tells the store how to decode a column family that may not exist yet. */
  def registerFamily(name: String, keySchema: StructType, valueSchema: StructType, spec: KeyStateEncoderSpec,
                     multipleValues: Boolean, internal: Boolean): Unit

  final def registerColFamily(name: String, keySchema: StructType, valueSchema: StructType,
                              spec: KeyStateEncoderSpec, multipleValues: Boolean, internal: Boolean): Unit =
    registerFamily(name, keySchema, valueSchema, spec, multipleValues, internal)

  def keyExists(key: UnsafeRow, colFamilyName: String): Boolean
  def multiGet(keys: Array[UnsafeRow], colFamilyName: String): Iterator[UnsafeRow]
  def prefixScanWithMultiValues(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair]
  def iteratorWithMultiValues(colFamilyName: String): StateStoreIterator[UnsafeRowPair]
  def rangeScan(startKey: Option[UnsafeRow], endKey: Option[UnsafeRow],
                colFamilyName: String): StateStoreIterator[UnsafeRowPair]
  def rangeScanWithMultiValues(startKey: Option[UnsafeRow], endKey: Option[UnsafeRow],
                               colFamilyName: String): StateStoreIterator[UnsafeRowPair]
  def allColumnFamilyNames: Set[String]
  def deleteRange(beginKey: UnsafeRow, endKey: UnsafeRow, colFamilyName: String): Unit
}

/**
 * keyedstate's provider as Spark 4.1 runs it: one maintenance call (see the 4.3 one), and stores
 * opened without 4.2's `forceSnapshotOnCommit` and `loadEmpty`, which keyedstate's own callers
 * (restores) still pass.
 */
trait ProviderShim extends StateStoreProvider {
  override final def supportedInstanceMetrics: Seq[StateStoreInstanceMetric] = StoreApi.instanceMetrics

  def cleanupMaintenance(): Unit

  override final def doMaintenance(): Unit = cleanupMaintenance()

  def getStore(version: Long, stateStoreCkptId: Option[String], forceSnapshotOnCommit: Boolean,
               loadEmpty: Boolean): StateStore

  override final def getStore(version: Long, stateStoreCkptId: Option[String]): StateStore =
    getStore(version, stateStoreCkptId, forceSnapshotOnCommit = false, loadEmpty = false)

  def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long, uniqueId: Option[String],
                                   forceSnapshotOnCommit: Boolean): StateStore

  override final def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long,
                                                  uniqueId: Option[String]): StateStore =
    upgradeReadStoreToWriteStore(readStore, version, uniqueId, forceSnapshotOnCommit = false)
}
