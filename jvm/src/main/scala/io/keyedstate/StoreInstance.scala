package io.keyedstate

import java.util.concurrent.locks.ReentrantReadWriteLock

import scala.collection.mutable
import scala.util.control.NonFatal

import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, StateStore}
import org.apache.spark.sql.types.StructType
import org.json4s.JValue

import io.keyedstate.checkpoint.ManifestColumnFamily
import io.keyedstate.checkpoint.commit.Changelog
import io.keyedstate.conf.{KeyedStateConf, TtlConfig}
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.rocks.{ColumnFamilyCodec, LocalRocksDB}
import io.keyedstate.ttl.{TtlCleanup, TtlCleanupTarget, TtlState}

/**
 * The loaded state of one partition: the working RocksDB, the codec of each column family, and
 * the exact number of keys per column family (kept up to date on every write when
 * `trackNumKeys` is on, so `numRowsTotal` is exact; otherwise RocksDB's estimate is reported).
 * With changelog checkpointing every write is also recorded in the version's changelog.
 */
private[keyedstate] object StoreInstance {
  /** Non-empty, without leading or trailing spaces (what Spark's providers accept). */
  def wellFormedName(name: String): Boolean = name != null && name.nonEmpty && name.trim == name

  /** At most this many keys' existence is remembered per version (about 40 bytes each and the key). */
  val MaxKnownKeys = 1000000

  private val logger = org.slf4j.LoggerFactory.getLogger(classOf[StoreInstance])
}

private[keyedstate] final class StoreInstance(
    val db: LocalRocksDB,
    storeName: String,
    conf: KeyedStateConf,
    useColumnFamilies: Boolean,
    knownColumnFamilies: Seq[ManifestColumnFamily],
    newChangelog: Option[() => Changelog.Writer],
    ttlOf: String => TtlConfig = _ => TtlConfig.Disabled,
    ttlCursors: Map[String, String] = Map.empty,
    committedDeclaration: Option[JValue] = None) extends TtlCleanupTarget with AutoCloseable {

  private val codecs = mutable.Map[String, ColumnFamilyCodec]()
  private val keyCounts = mutable.Map[String, Long]()
  knownColumnFamilies.foreach(cf => keyCounts(cf.name) = cf.numKeys)
  private val previousDescriptions = knownColumnFamilies.map(cf => cf.name -> cf).toMap

  /** TTL: stamps, visibility and refresh of reads; and the cleanup strategies (docs/ttl.md). */
  val ttl: TtlState = new TtlState(ttlOf, (cf, key, value) => write(cf, key, value, merge = false))
  val ttlCleanup: TtlCleanup = new TtlCleanup(this, ttl, ttlCursors)

  // Background TTL cleanup reads the database from the maintenance thread: close waits for it.
  private val closeGuard = new ReentrantReadWriteLock()
  @volatile private var closing = false
  override def isClosing: Boolean = closing
  /** Runs `f` unless the instance is closing; close waits until `f` returns. */
  override def readGuarded[T](f: => T): Option[T] = {
    closeGuard.readLock().lock()
    try if (closing) None else Some(f) finally closeGuard.readLock().unlock()
  }

  override def isMultiValue(cf: String): Boolean =
    codecs.get(cf).map(_.multipleValues).orElse(previousDescriptions.get(cf).map(_.multipleValues)).getOrElse(false)

  /**
   * Writes happened (or were attempted) since the version was loaded or committed. Set before a
   * write touches RocksDB or the changelog: a write that fails half-way (a full local disk) leaves
   * the instance dirty, so it is dropped and rebuilt rather than served as the loaded version.
   */
  var dirty: Boolean = false

  private var _declaration: Option[JValue] = committedDeclaration

  /** What the operator declared about its state, as the next manifest records it (see VersionManifest). */
  def declaration: Option[JValue] = _declaration

  /**
   * A new declaration, committed with the next version. A change makes the instance dirty: an
   * aborted version's declaration is dropped with it, never kept by a version that did not commit.
   */
  def declare(d: JValue): Unit = if (!_declaration.contains(d)) {
    dirty = true
    _declaration = Some(d)
  }

  /**
   * Whether lookups read this store (queryable state): each commit then publishes a view of the
   * version ([[CommittedViews]]). Set by the store's user every batch; an instance keeps it.
   */
  @volatile var queryable: Boolean = false

  /** Whether the instance still is the version loaded or last committed: not dirty, no write lost. */
  def servable: Boolean = !dirty && db.healthy

  // Whether keys exist, as learnt since the last commit: exact key counting without a second
  // lookup per write (see KeyMemo).
  private val memo = new KeyMemo(StoreInstance.MaxKnownKeys)

  /** Whether writes keep exact key counts (and so whether scans are worth remembering). */
  def tracksNumKeys: Boolean = conf.trackNumKeys

  /** Taken when a prefix scan starts, handed back to [[rememberScanned]] when it ends. */
  def scanEpoch: Long = memo.epoch

  /** A prefix scan that started at `epoch` reached its end: `keys` are all the keys under `prefix`. */
  def rememberScanned(cf: String, prefix: Array[Byte], keys: Iterable[Array[Byte]], epoch: Long): Unit =
    if (conf.trackNumKeys) memo.learnScanned(cf, prefix, keys, epoch)

  /** Whether `key` existed before a write that makes it exist or not (`existsNow`). */
  private def existed(cf: String, key: Array[Byte], existsNow: Boolean): Boolean =
    memo.existedBefore(cf, key, existsNow) match {
      case KeyMemo.Present => true
      case KeyMemo.Absent => false
      case _ => db.exists(cf, key)
    }

  /** A point read (that also teaches the key count whether the key exists). */
  def read(cf: String, key: Array[Byte]): Array[Byte] = {
    val epoch = memo.epoch
    val value = db.get(cf, key)
    if (conf.trackNumKeys) memo.learn(cf, key, value != null, epoch)
    value
  }

  /** Called at commit: the memo serves one version's writes. */
  def forgetKnownKeys(): Unit = {
    memo.clear()
    learnEmptyFamilies()
  }

  /**
   * The families that hold no key tell the memo so: writes into them need no lookup. Only an
   * optimisation, run after a commit is published: a failure to look is logged, not thrown.
   */
  private def learnEmptyFamilies(): Unit = if (conf.trackNumKeys) {
    try keyCounts.foreach { case (cf, n) => if (n == 0 && db.hasColumnFamily(cf) && db.isEmpty(cf)) memo.learnEmpty(cf) }
    catch {
      case NonFatal(e) => StoreInstance.logger.warn(s"Could not check which column families of ${db.dir} are empty", e)
    }
  }
  learnEmptyFamilies()

  private var changelog: Option[Changelog.Writer] = None
  private def log: Option[Changelog.Writer] = {
    if (changelog.isEmpty) changelog = newChangelog.map(_())
    changelog
  }

  /** The changelog of the writes since the last commit, handed over to the commit. */
  def takeChangelog(): Option[Changelog.Writer] = {
    val taken = changelog
    changelog = None
    taken
  }

  /** The codec of column family `cf`, for `operation` (named in the error when there is none). */
  def codec(cf: String, operation: String = "use"): ColumnFamilyCodec =
    codecs.getOrElse(cf, throw KeyedStateErrors.missingColumnFamily(operation, cf, codecs.keys))

  def columnFamilyNames: Set[String] = codecs.keySet.toSet.intersect(db.columnFamilies)

  def registerCodec(
      name: String,
      keySchema: StructType,
      valueSchema: StructType,
      spec: KeyStateEncoderSpec,
      multipleValues: Boolean,
      isInternal: Boolean): Unit = {
    if (!StoreInstance.wellFormedName(name)) throw KeyedStateErrors.invalidColumnFamilyName("register", String.valueOf(name))
    if (name != StateStore.DEFAULT_COL_FAMILY_NAME) requireColumnFamilies("register", name)
    codecs(name) = new ColumnFamilyCodec(storeName, name, keySchema, valueSchema, spec, multipleValues, isInternal)
  }

  def createColumnFamily(
      name: String,
      keySchema: StructType,
      valueSchema: StructType,
      spec: KeyStateEncoderSpec,
      multipleValues: Boolean,
      isInternal: Boolean): Unit = {
    checkCreatable("create", name, isInternal)
    registerCodec(name, keySchema, valueSchema, spec, multipleValues, isInternal)
    if (!db.hasColumnFamily(name)) {
      dirty = true
      db.createColumnFamily(name)
      log.foreach(_.createColumnFamily(name))
      keyCounts(name) = 0
      if (conf.trackNumKeys) memo.learnEmpty(name)
    }
  }

  /** The names Spark's providers refuse to create or remove, refused as they refuse them. */
  private def checkCreatable(operation: String, name: String, isInternal: Boolean): Unit = {
    requireColumnFamilies(operation, name)
    if (!StoreInstance.wellFormedName(name) || name == StateStore.DEFAULT_COL_FAMILY_NAME) {
      throw KeyedStateErrors.invalidColumnFamilyName(operation, String.valueOf(name))
    }
    if (!isInternal && name.charAt(0) == '_') throw KeyedStateErrors.reservedColumnFamilyName(name)
  }

  private def requireColumnFamilies(operation: String, name: String): Unit = if (!useColumnFamilies) {
    throw KeyedStateErrors.unsupportedCall(s"$operation column family '$name'",
      "multiple column families need a state store initialised with useColumnFamilies=true")
  }

  def removeColumnFamily(name: String): Boolean = {
    checkCreatable("remove", name, isInternal = true)
    codecs.remove(name)
    keyCounts.remove(name)
    memo.forget(name)
    if (db.hasColumnFamily(name)) dirty = true
    val existed = db.dropColumnFamily(name)
    if (existed) log.foreach(_.dropColumnFamily(name))
    existed
  }

  override def write(cf: String, key: Array[Byte], value: Array[Byte], merge: Boolean): Unit = {
    dirty = true
    if (conf.trackNumKeys && !existed(cf, key, existsNow = true)) adjust(cf, 1)
    if (merge) {
      db.merge(cf, key, value)
      log.foreach(_.merge(cf, key, value))
    } else {
      db.put(cf, key, value)
      log.foreach(_.put(cf, key, value))
    }
  }

  override def delete(cf: String, key: Array[Byte]): Unit = {
    dirty = true
    if (conf.trackNumKeys && existed(cf, key, existsNow = false)) adjust(cf, -1)
    db.delete(cf, key)
    log.foreach(_.delete(cf, key))
  }

  def deleteRange(cf: String, begin: Array[Byte], end: Array[Byte]): Unit = {
    dirty = true
    if (conf.trackNumKeys) {
      val it = db.scan(cf, Some(begin), Some(end))
      try adjust(cf, -it.size) finally it.close()
    }
    memo.forget(cf) // a range is not worth tracking key by key; forgotten first, as writes record first
    db.deleteRange(cf, begin, end)
    log.foreach(_.deleteRange(cf, begin, end))
  }

  private def adjust(cf: String, delta: Long): Unit =
    keyCounts(cf) = keyCounts.getOrElse(cf, 0L) + delta

  def numKeys(cf: String): Long =
    if (conf.trackNumKeys) keyCounts.getOrElse(cf, 0L) else db.estimateNumKeys(cf)

  /** Keys in the user-visible column families (internal ones, e.g. indexes, are left out). */
  def numUserKeys: Long = db.columnFamilies.iterator
    .filterNot(cf => codecs.get(cf).exists(_.isInternal) || previousDescriptions.get(cf).exists(_.internal))
    .map(numKeys).sum

  /** The column families as the next manifest records them. */
  def describeColumnFamilies: Seq[ManifestColumnFamily] = db.columnFamilies.toSeq.sorted.map { name =>
    codecs.get(name) match {
      case Some(c) =>
        ManifestColumnFamily(name, numKeys(name), c.keySchema.json, c.valueSchema.json, c.keySpec.json,
          c.multipleValues, c.isInternal)
      case None =>
        previousDescriptions.get(name).map(_.copy(numKeys = numKeys(name)))
          .getOrElse(ManifestColumnFamily(name, numKeys(name), "", "", "", false, false))
    }
  }

  override def close(): Unit = {
    closing = true
    closeGuard.writeLock().lock()
    try {
      takeChangelog().foreach(_.close())
      db.close()
    } finally closeGuard.writeLock().unlock()
  }
}
