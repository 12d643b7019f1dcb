package io.keyedstate.shims

import java.io.InputStream

import net.jpountz.lz4.LZ4BlockInputStream
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, RangeKeyScanStateEncoderSpec, ReadStateStore, RocksDBKeyStateEncoder, StateStore, StateStoreCustomSizeMetric, StateStoreIterator, StateStoreProvider, UnsafeRowPair}
import org.apache.spark.sql.types.StructType

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * What Spark 4.0 and 4.1 share (each version's `SparkShims` is this, see the 4.3 one): their store
 * API predates 4.2's. Their read stores have no column-family listing or list iterators, and their
 * providers open no store empty at a batch. keyedstate's own store has them all; Spark's stores are
 * refused where they would be needed, naming the version that can.
 */
trait SparkShimsBefore42 {
  /** The Spark minor version of this jar. */
  val SparkMinor: String

  /** No `isSnapshot` before 4.3: a progress sums this metric over the partitions. */
  def stateSizeMetric(name: String, desc: String): StateStoreCustomSizeMetric =
    StateStoreCustomSizeMetric(name, desc)

  private def ours(store: ReadStateStore, what: String): StoreShimBefore42 = store match {
    case ours: StoreShimBefore42 => ours
    case other => throw KeyedStateErrors.unsupported(ErrorId.UnsupportedSparkVersion,
      s"Spark $SparkMinor's ${other.getClass.getName} cannot $what of its checkpoint (Spark 4.3 can): read it on " +
        "Spark 4.3")
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
   * Opens a writable store. Spark's providers take neither `forceSnapshotOnCommit` nor
   * `loadEmpty` before 4.2: they open a store empty only at version 0 (the HDFS-backed provider's
   * restore starts there, see offline.CheckpointWriter); a restore at a later batch needs keyedstate's.
   */
  def getStore(provider: StateStoreProvider, version: Long, checkpointId: Option[String],
               forceSnapshotOnCommit: Boolean, loadEmpty: Boolean): StateStore = provider match {
    case ours: ProviderShimBefore42 => ours.getStore(version, checkpointId, forceSnapshotOnCommit, loadEmpty)
    case other =>
      if (loadEmpty) checkOpensEmpty(other.getClass, version)
      other.getStore(version, checkpointId)
  }

  /** Refuses, before anything is written, a store of `provider` opened empty at `version`. */
  def checkOpensEmpty(provider: Class[_], version: Long): Unit =
    if (version > 0 && !classOf[ProviderShimBefore42].isAssignableFrom(provider)) {
      throw KeyedStateErrors.unsupported(ErrorId.UnsupportedSparkVersion,
        s"Spark $SparkMinor's ${provider.getName} cannot open an empty store at batch $version (getStore's " +
          "loadEmpty is new in Spark 4.2): restore into keyedstate's provider, or run the restore on Spark 4.2 or later")
    }

  /** The key encoders cannot say before 4.2: only the range-scan spec scans ranges. */
  def supportsRangeScan(spec: KeyStateEncoderSpec, encoder: RocksDBKeyStateEncoder): Boolean =
    spec.isInstanceOf[RangeKeyScanStateEncoderSpec]

  /** lz4-java 1.8 (Spark 4.0's and 4.1's) has constructors only; the streams are the same bytes. */
  def lz4Input(in: InputStream): InputStream = new LZ4BlockInputStream(in)
}

/**
 * keyedstate's store as Spark 4.0 and 4.1 see it: their `ReadStateStore` and `StateStore` lack
 * the members declared here (new in 4.2 and 4.3), which keyedstate's store implements all the
 * same, for its own operators and readers.
 */
trait StoreShimBefore42 extends StateStore {
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
 * keyedstate's provider as Spark 4.0 and 4.1 run it: one maintenance call (see the 4.3 one), and
 * stores opened without 4.2's `forceSnapshotOnCommit` and `loadEmpty`, which keyedstate's own
 * callers (restores) still pass.
 */
trait ProviderShimBefore42 extends StateStoreProvider {
  def cleanupMaintenance(): Unit

  override final def doMaintenance(): Unit = cleanupMaintenance()

  def getStore(version: Long, stateStoreCkptId: Option[String], forceSnapshotOnCommit: Boolean,
               loadEmpty: Boolean): StateStore

  override final def getStore(version: Long, stateStoreCkptId: Option[String]): StateStore =
    getStore(version, stateStoreCkptId, forceSnapshotOnCommit = false, loadEmpty = false)

  def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long, uniqueId: Option[String],
                                   forceSnapshotOnCommit: Boolean): StateStore
}
