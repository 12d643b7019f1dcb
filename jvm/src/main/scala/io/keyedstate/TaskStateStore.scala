package io.keyedstate

import scala.collection.mutable

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType
import org.json4s.JValue

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.rocks.{ClosableIterator, ColumnFamilyCodec}
import io.keyedstate.shims.StoreShim

private[keyedstate] object TaskStateStore {
  /** A prefix scan with more entries than this does not teach the key count's memo. */
  val MaxScanRemembered = 10000
  /** A stamp [[TaskStateStore.putStamped]] replaces with the batch's time (a table row without one). */
  val Unstamped: Long = Long.MinValue
}

/**
 * One version of one state store partition, open for reading (`getReadStore`) or for updates
 * (`getStore`). Reads see the store's own uncommitted writes. `commit()` makes the next version
 * durable; `abort()` drops the writes. The provider owns the RocksDB instance; a store is a
 * short-lived view of it for one task, holding the instance it was opened on (no provider lock
 * per read or write).
 */
final class TaskStateStore private[keyedstate] (
    provider: KeyedStateStoreProvider,
    state: StoreInstance,
    override val version: Long,
    private var writable: Boolean,
    private var snapshotOnCommit: Boolean) extends StoreShim {

  private sealed trait Phase
  private case object Open extends Phase
  private case object Committed extends Phase
  private case object Aborted extends Phase
  private case object Released extends Phase

  @volatile private var phase: Phase = Open
  private var committedVersion = -1L
  private var checkpointInfo: StateStoreCheckpointInfo = _

  override def id: StateStoreId = provider.stateStoreId

  private def checkOpen(op: String): Unit = if (phase != Open) {
    throw KeyedStateErrors.badState(ErrorId.UnsupportedOperation,
      s"Cannot $op on state store ${id} version $version: it is ${phase.toString.toLowerCase}")
  }
  private def requireKey(key: UnsafeRow, op: String): Unit =
    if (key == null) throw KeyedStateErrors.badArgument(ErrorId.InvalidStoreArgument, s"Cannot $op a null key")

  private def requireValues(values: Array[UnsafeRow], op: String, cf: String): Unit =
    if (values == null || values.exists(_ == null)) throw KeyedStateErrors.badArgument(ErrorId.InvalidStoreArgument,
      s"Cannot $op a null list or a null value in column family '$cf'")

  private def checkWritable(op: String): Unit = {
    checkOpen(op)
    if (!writable) throw KeyedStateErrors.badState(ErrorId.UnsupportedOperation, s"Cannot $op on read-only state store $id version $version")
  }

  /** Turns this read store into the write store of the same loaded version (no reload). */
  private[keyedstate] def upgradeToWritable(forceSnapshot: Boolean): TaskStateStore = {
    checkOpen("upgrade")
    writable = true
    snapshotOnCommit = forceSnapshot
    this
  }
  /** Spark asked for a snapshot with this commit (its coordinator saw snapshot upload lag). */
  private[keyedstate] def forceSnapshot: Boolean = snapshotOnCommit
  private[keyedstate] def isOpen: Boolean = phase == Open
  private[keyedstate] def isWritable: Boolean = writable
  /** The provider took the instance over for another store (same task thread re-entering). */
  private[keyedstate] def invalidate(): Unit = if (phase == Open) phase = Aborted

  // ---- reads ----

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
    checkOpen("get")
    requireKey(key, "get")
    val codec = state.codec(colFamilyName, "get")
    val bytes = readLive(colFamilyName, codec, codec.encodeKey(key))
    if (bytes == null) null else codec.decodeValue(bytes)
  }

  override def keyExists(key: UnsafeRow, colFamilyName: String): Boolean = {
    checkOpen("keyExists")
    requireKey(key, "keyExists")
    val codec = state.codec(colFamilyName, "keyExists")
    readLive(colFamilyName, codec, codec.encodeKey(key)) != null
  }

  /** A point read as TTL lets it be seen (expired entries hidden, refreshed on read if configured). */
  private def readLive(cf: String, codec: ColumnFamilyCodec, key: Array[Byte]): Array[Byte] = {
    val bytes = state.ttl.onRead(cf, codec.multipleValues, key, state.read(cf, key), writable)
    accessed()
    bytes
  }

  /** Incremental TTL cleanup per state access (`ttl.cleanup.incremental.everyRecord`). */
  private def accessed(): Unit = if (writable) state.ttlCleanup.onAccess()

  override def multiGet(keys: Array[UnsafeRow], colFamilyName: String): Iterator[UnsafeRow] =
    keys.iterator.map(get(_, colFamilyName))

  override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] = {
    checkOpen("valuesIterator")
    requireKey(key, "valuesIterator")
    val codec = state.codec(colFamilyName, "valuesIterator")
    val bytes = readLive(colFamilyName, codec, codec.encodeKey(key))
    if (bytes == null) Iterator.empty else codec.decodeValues(bytes).iterator
  }

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    scanPrefix(prefixKey, colFamilyName, multi = false)

  override def prefixScanWithMultiValues(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    scanPrefix(prefixKey, colFamilyName, multi = true)

  private def scanPrefix(prefixKey: UnsafeRow, cf: String, multi: Boolean): StateStoreIterator[UnsafeRowPair] = {
    checkOpen("prefixScan")
    val codec = state.codec(cf, "prefixScan")
    if (!codec.supportsPrefixScan) {
      throw KeyedStateErrors.unsupportedCall("prefixScan",
        s"it needs a prefix-key encoder; column family '$cf' uses ${codec.keySpec}")
    }
    val prefix = codec.encodePrefix(prefixKey)
    val raw = state.db.prefixScan(cf, prefix)
    pairs(if (state.tracksNumKeys) remembering(raw, cf, prefix) else raw, cf, codec, multi)
  }

  /** The raw entries of a prefix scan; one that reaches its end tells the key count's memo
   * which keys exist under the prefix (expired ones included: they are still stored). */
  private def remembering(
      raw: ClosableIterator[(Array[Byte], Array[Byte])],
      cf: String,
      prefix: Array[Byte]): ClosableIterator[(Array[Byte], Array[Byte])] =
    new ClosableIterator[(Array[Byte], Array[Byte])] {
      private val epoch = state.scanEpoch
      private val seen = mutable.ArrayBuffer.empty[Array[Byte]]
      private var settled = false // told the memo, or too many entries to tell it
      def hasNext: Boolean = {
        val more = raw.hasNext
        if (!more && !settled) {
          settled = true
          state.rememberScanned(cf, prefix, seen, epoch)
        }
        more
      }
      def next(): (Array[Byte], Array[Byte]) = {
        val entry = raw.next()
        if (!settled) {
          seen += entry._1
          if (seen.length > TaskStateStore.MaxScanRemembered) { settled = true; seen.clear() }
        }
        entry
      }
      def close(): Unit = raw.close()
    }

  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    checkOpen("iterator")
    val codec = state.codec(colFamilyName, "iterator")
    pairs(state.db.scan(colFamilyName, None, None), colFamilyName, codec, multi = false)
  }

  override def iteratorWithMultiValues(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    checkOpen("iterator")
    val codec = state.codec(colFamilyName, "iterator")
    pairs(state.db.scan(colFamilyName, None, None), colFamilyName, codec, multi = true)
  }

  override def rangeScan(
      startKey: Option[UnsafeRow],
      endKey: Option[UnsafeRow],
      colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    scanRange(startKey, endKey, colFamilyName, multi = false)

  override def rangeScanWithMultiValues(
      startKey: Option[UnsafeRow],
      endKey: Option[UnsafeRow],
      colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    scanRange(startKey, endKey, colFamilyName, multi = true)

  /** Keys from `startKey` (inclusive) to `endKey` (exclusive) in the range-scan order. */
  private def scanRange(start: Option[UnsafeRow], end: Option[UnsafeRow], cf: String, multi: Boolean) = {
    checkOpen("rangeScan")
    val codec = rangeCodec(cf, "rangeScan")
    pairs(state.db.scan(cf, start.map(codec.encodeBound), end.map(codec.encodeBound)), cf, codec, multi)
  }

  private def rangeCodec(cf: String, op: String): ColumnFamilyCodec = {
    val codec = state.codec(cf, op)
    if (!codec.supportsRangeScan) {
      throw KeyedStateErrors.unsupportedCall(op,
        s"it needs a range-scan key encoder; column family '$cf' uses ${codec.keySpec}")
    }
    codec
  }

  /**
   * Multi-value column families yield one pair per value (`multi`) or the first value. Expired
   * entries (elements) are left out when TTL hides them; scans never refresh.
   */
  private def pairs(
      raw: ClosableIterator[(Array[Byte], Array[Byte])],
      cf: String,
      codec: ColumnFamilyCodec,
      multi: Boolean): StateStoreIterator[UnsafeRowPair] = {
    val rows = visible(raw, cf, codec).flatMap { case (k, v) =>
      val key = codec.decodeKey(k)
      if (multi && codec.multipleValues) codec.decodeValues(v).iterator.map(new UnsafeRowPair(key, _))
      else Iterator.single(new UnsafeRowPair(key, codec.decodeValue(v)))
    }
    new StateStoreIterator(rows, () => raw.close())
  }

  /** The stored entries a scan shows: expired ones (elements) left out when TTL hides them. */
  private def visible(raw: Iterator[(Array[Byte], Array[Byte])], cf: String,
      codec: ColumnFamilyCodec): Iterator[(Array[Byte], Array[Byte])] =
    if (!state.ttl.config(cf).hidesExpired) raw
    else raw.flatMap { case (k, stored) =>
      val v = state.ttl.onScan(cf, codec.multipleValues, stored)
      if (v == null) None else Some(k -> v)
    }

  /**
   * Every entry a scan of `cf` shows, each value with its last-access stamp: what a savepoint
   * keeps of TTL'd state, so that a restore expires it as the query would have.
   */
  private[keyedstate] def stampedEntries(cf: String): StateStoreIterator[(UnsafeRow, IndexedSeq[(UnsafeRow, Long)])] = {
    checkOpen("iterator")
    val codec = state.codec(cf, "iterator")
    val raw = state.db.scan(cf, None, None)
    new StateStoreIterator(visible(raw, cf, codec).map { case (k, v) => codec.decodeKey(k) -> codec.decodeStamped(v) },
      () => raw.close())
  }

  override def allColumnFamilyNames: Set[String] = state.columnFamilyNames

  override def registerFamily(
      colFamilyName: String,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useMultipleValuesPerKey: Boolean,
      isInternal: Boolean): Unit =
    state.registerCodec(colFamilyName, keySchema, valueSchema, keyStateEncoderSpec,
      useMultipleValuesPerKey, isInternal)

  // ---- writes ----

  override def createColFamilyIfAbsent(
      colFamilyName: String,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useMultipleValuesPerKey: Boolean,
      isInternal: Boolean): Unit = {
    checkWritable("createColFamilyIfAbsent")
    state.createColumnFamily(colFamilyName, keySchema, valueSchema, keyStateEncoderSpec,
      useMultipleValuesPerKey, isInternal)
  }

  override def removeColFamilyIfExists(colFamilyName: String): Boolean = {
    checkWritable("removeColFamilyIfExists")
    state.removeColumnFamily(colFamilyName)
  }

  override def put(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
    checkWritable("put")
    requireKey(key, "put")
    if (value == null) throw KeyedStateErrors.badArgument(ErrorId.InvalidStoreArgument,
      s"Cannot put a null value in column family '$colFamilyName' (remove the key instead)")
    val codec = state.codec(colFamilyName, "put")
    state.write(colFamilyName, codec.encodeKey(key), codec.encodeValue(value, state.ttl.stamp(colFamilyName)),
      merge = false)
    accessed()
  }

  override def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = {
    checkWritable("putList")
    requireKey(key, "putList")
    requireValues(values, "putList", colFamilyName)
    val codec = state.codec(colFamilyName, "putList")
    state.write(colFamilyName, codec.encodeKey(key), codec.encodeValues(values, state.ttl.stamp(colFamilyName)),
      merge = false)
    accessed()
  }

  /** A value, or a multi-value entry, written with the stamps it was read with ([[stampedEntries]]). */
  private[keyedstate] def putStamped(key: UnsafeRow, values: Array[UnsafeRow], stamps: Array[Long], cf: String): Unit = {
    checkWritable("put")
    requireKey(key, "put")
    requireValues(values, "put", cf)
    val codec = state.codec(cf, "put")
    lazy val now = state.ttl.stamp(cf)
    val resolved = stamps.map(s => if (s == TaskStateStore.Unstamped) now else s)
    state.write(cf, codec.encodeKey(key), codec.encodeStamped(values, resolved), merge = false)
  }

  override def merge(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit =
    mergeList(key, Array(value), colFamilyName)

  override def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = {
    checkWritable("merge")
    requireKey(key, "merge")
    requireValues(values, "merge", colFamilyName)
    val codec = state.codec(colFamilyName, "merge")
    if (!codec.multipleValues) {
      throw KeyedStateErrors.unsupportedCall("merge",
        s"it needs a column family with multiple values per key; '$colFamilyName' has one")
    }
    state.write(colFamilyName, codec.encodeKey(key), codec.encodeValues(values, state.ttl.stamp(colFamilyName)),
      merge = true)
    accessed()
  }

  override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
    checkWritable("remove")
    requireKey(key, "remove")
    state.delete(colFamilyName, state.codec(colFamilyName, "remove").encodeKey(key))
    accessed()
  }

  override def deleteRange(beginKey: UnsafeRow, endKey: UnsafeRow, colFamilyName: String): Unit = {
    checkWritable("deleteRange")
    val codec = rangeCodec(colFamilyName, "deleteRange")
    state.deleteRange(colFamilyName, codec.encodeBound(beginKey), codec.encodeBound(endKey))
  }

  // ---- the operator's declaration (kept in each version's manifest) ----

  /** What the operator declared about its state when this version was committed (None: nothing). */
  def declaration: Option[JValue] = state.declaration

  /** Declares the operator's state layout; committed with the next version, dropped by an abort. */
  def declare(d: JValue): Unit = {
    checkWritable("declare the operator's state")
    state.declare(d)
  }

  /** The manifest of the loaded version (for errors that name it). */
  def loadedManifest: Path = provider.loadedManifest

  /**
   * Lookups read this store's committed versions (queryable state): the loaded version and each
   * commit's are published as views. Called before any write.
   */
  def makeQueryable(): Unit = provider.makeQueryable(this)

  // ---- lifecycle ----

  override def commit(): Long = {
    checkWritable("commit")
    val (newVersion, info) = provider.commit(this)
    committedVersion = newVersion
    checkpointInfo = info
    phase = Committed
    newVersion
  }

  override def abort(): Unit = if (phase == Open) {
    phase = Aborted
    provider.finish(this, discardWrites = writable)
  }

  override def release(): Unit = if (phase == Open) {
    phase = Released
    provider.finish(this, discardWrites = writable)
  }

  override def hasCommitted: Boolean = phase == Committed

  override def metrics: StateStoreMetrics = provider.metrics

  override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo = {
    if (checkpointInfo == null) {
      throw KeyedStateErrors.badState(ErrorId.UnsupportedOperation,
        s"getStateStoreCheckpointInfo called before commit on state store $id version $version")
    }
    checkpointInfo
  }

  override def toString: String = s"TaskStateStore[$id, version=$version, ${phase.toString.toLowerCase}]"
}
