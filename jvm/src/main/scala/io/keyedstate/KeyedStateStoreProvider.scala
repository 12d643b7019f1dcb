package io.keyedstate

import java.io.File
import java.util.UUID
import java.util.concurrent.TimeUnit
import java.util.concurrent.locks.ReentrantLock

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.{SparkEnv, TaskContext}
import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType

import io.keyedstate.checkpoint.{CheckpointStore, LocalFileCache, LocalFiles, RescaleJournal, StoreLease}
import io.keyedstate.checkpoint.commit.{CommitStats, SnapshotStrategy, VersionLineage}
import io.keyedstate.checkpoint.restore.{LoadStats, RestoreOperation}
import io.keyedstate.checkpoint.retention.RetentionCleaner
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateError, KeyedStateErrors}
import io.keyedstate.metrics.KeyedStateMetrics
import io.keyedstate.rocks.{DbSnapshot, LocalRocksDB}
import io.keyedstate.shims.SparkTypes.StreamExecution
import io.keyedstate.shims.{ProviderShim, SparkVersionCheck, StoreApi}
import io.keyedstate.ttl.{TtlClock, TtlStats}

/**
 * keyedstate's state store provider: one RocksDB instance per (operator, partition, store),
 * made durable as incremental, versioned checkpoints in the query's checkpoint location.
 *
 * Enable with `spark.sql.streaming.stateStore.providerClass=io.keyedstate.KeyedStateStoreProvider`.
 * The pieces: [[StoreInstance]] (the loaded RocksDB), [[SnapshotStrategy]] (commit),
 * [[StoreLoader]] and [[RestoreOperation]] (load), [[RetentionCleaner]] (old versions and orphans),
 * [[CheckpointStore]] (the files on the Hadoop FileSystem).
 */
class KeyedStateStoreProvider extends ProviderShim with Logging {

  private var id: StateStoreId = _
  private var conf: KeyedStateConf = _
  private var storeConf: StateStoreConf = _
  private var hadoopConf: Configuration = _

  private var checkpointStore: CheckpointStore = _
  private var localRoot: File = _
  private var dbDir: File = _
  private var workDir: File = _
  private var cache: LocalFileCache = _
  private var loader: StoreLoader = _
  private var cleaner: RetentionCleaner = _

  // The loaded version and its durable history, changed under `this`. Volatile: maintenance
  // reads them without waiting for a load or commit that holds `this`.
  @volatile private var loaded: StoreInstance = _
  @volatile private var lineage: VersionLineage = _
  @volatile private var lastCommit: Option[CommitStats] = None
  @volatile private var lastLoad: Option[LoadStats] = None
  // When this provider last claimed its store partition for the running query (StoreLease).
  @volatile private var leaseRefreshedMs = 0L
  @volatile private var lastTtl: TtlStats = TtlStats()
  // The last version whose snapshot this instance made durable (Spark's SnapshotLastUploaded).
  @volatile private var lastSnapshotUploaded = -1L

  // One store at a time uses the instance.
  private var activeStore: TaskStateStore = _
  private var activeThread: Thread = _

  // Commit and cleanup never overlap on one partition: cleanup must not take a commit's
  // freshly uploaded (not yet listed) files for orphans. Cleanup only tries the lock: Spark runs
  // every store's cleanup on one small pool, so waiting out a long commit (a slow or hung
  // checkpoint file system) would stall the cleanup of every other store on the executor.
  private val filesLock = new ReentrantLock()

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConfs: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    SparkVersionCheck.check()
    this.id = stateStoreId
    this.conf = KeyedStateConf(storeConfs)
    KeyedStateStoreProvider.refuseTtlOnJoinState(stateStoreId, conf)
    this.storeConf = storeConfs
    this.hadoopConf = hadoopConf

    // A rescale of this checkpoint in progress (or interrupted) makes its state unusable.
    RescaleJournal.checkNoRescaleInProgress(new Path(stateStoreId.checkpointRootLocation).getParent, hadoopConf)
    checkpointStore = new CheckpointStore(new Path(stateStoreId.storeCheckpointLocation().toString), hadoopConf)
    checkpointStore.ensureRoot()
    val localBase = KeyedStateStoreProvider.localBaseDir(conf)
    localRoot = new File(localBase,
      s"${stateStoreId.operatorId}-${stateStoreId.partitionId}-${stateStoreId.storeName}-${UUID.randomUUID()}")
    dbDir = new File(localRoot, "db")
    cache = LocalFileCache.forStore(new File(localBase, "cache"), checkpointStore.root.toString)
    workDir = new File(localRoot, "work")
    workDir.mkdirs()
    val schema = StoreSchema(keySchema, valueSchema, keyStateEncoderSpec, useColumnFamilies, useMultipleValuesPerKey)
    loader = new StoreLoader(id, schema, conf, storeConfs, checkpointStore, cache,
      new SnapshotStrategy(checkpointStore, workDir, conf), new RestoreOperation(checkpointStore, cache, conf),
      dbDir, workDir, reportSnapshotUploaded)
    cleaner = new RetentionCleaner(checkpointStore, conf)
  }

  override def stateStoreId: StateStoreId = id

  /** The manifest of the loaded version, as errors name it. */
  private[keyedstate] def loadedManifest: Path = synchronized {
    // A restored version is saved by version alone though its manifest keeps the source's id
    // (only error messages ask, so the look-up costs nothing on the way of a batch).
    val byId = lineage.checkpointId.filter(_ => conf.checkpointIdsEnabled)
    if (byId.exists(id => checkpointStore.hasManifest(lineage.version, Some(id)))) {
      checkpointStore.manifestPath(lineage.version, byId)
    } else checkpointStore.manifestPath(lineage.version, None)
  }

  // ---- opening stores ----

  override def getStore(
      version: Long,
      stateStoreCkptId: Option[String],
      forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore = synchronized {
    activeStore match {
      // Spark 4.0 has no upgradeReadStoreToWriteStore: its aggregation opens the write store of
      // the version its task's read store has open, and goes on reading through that read store.
      case read: TaskStateStore if activeThread == Thread.currentThread() && read.isOpen && !read.isWritable &&
          read.version == version && !loadEmpty && stateStoreCkptId.forall(lineage.checkpointId.contains) =>
        upgradeInPlace(read, forceSnapshotOnCommit)
      case _ => open(version, stateStoreCkptId, loadEmpty, writable = true, forceSnapshotOnCommit)
    }
  }

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore =
    open(version, uniqueId, loadEmpty = false, writable = false, forceSnapshot = false)

  /** The aggregation operators read, then update, the same version in one task: no reload. */
  override def upgradeReadStoreToWriteStore(
      readStore: ReadStateStore,
      version: Long,
      uniqueId: Option[String],
      forceSnapshotOnCommit: Boolean): StateStore = synchronized {
    readStore match {
      case ours: TaskStateStore if (ours eq activeStore) && ours.isOpen && ours.version == version =>
        upgradeInPlace(ours, forceSnapshotOnCommit)
      case other =>
        StoreApi.release(other)
        getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty = false)
    }
  }

  /** The task's open read store, now writable: its loaded instance serves the writes. */
  private def upgradeInPlace(read: TaskStateStore, forceSnapshotOnCommit: Boolean): StateStore = {
    refuseSavepoint()
    claimLease()
    read.upgradeToWritable(forceSnapshotOnCommit)
  }

  private def open(
      version: Long,
      checkpointId: Option[String],
      loadEmpty: Boolean,
      writable: Boolean,
      forceSnapshot: Boolean): TaskStateStore =
    synchronized {
      if (version < 0) throw KeyedStateErrors.unexpectedVersion(version)
      if (writable) refuseSavepoint()
      try {
        acquire() // a partition held past the wait is Spark's UNRELEASED_THREAD_ERROR (cannotLoad)
        load(version, checkpointId, loadEmpty)
        // The store serves micro-batch `version`: TTL stamps and expires with that batch's time.
        val instance = loaded
        instance.ttl.beginBatch(() => TtlClock.at(id.checkpointRootLocation, version, hadoopConf))
        instance.ttlCleanup.refresh()
        if (writable) claimLease()
        val store = new TaskStateStore(this, loaded, version, writable, forceSnapshot)
        activeStore = store
        activeThread = Thread.currentThread()
        // Spark 4.0 gives no read store back (4.1+ release it): one its task left open would hold
        // the partition until another task's acquireTimeoutMs. Released at the task's end (once).
        if (!writable) Option(TaskContext.get()).foreach(_.addTaskCompletionListener[Unit](_ => store.release()))
        // Spark's operators made queryable (keyedstate.queryable): one store each, by operator id.
        if (conf.queryableOperators.contains(id.operatorId) && id.storeName == StateStoreId.DEFAULT_STORE_NAME) {
          makeQueryable(store)
        }
        store
      } catch {
        case NonFatal(e) =>
          notifyAll()
          throw KeyedStateErrors.cannotLoad(id, version, e)
      }
    }

  // Whether the store lies in a savepoint's folder (`<savepoint>/state/<op>/<partition>`).
  private lazy val inSavepoint: Boolean = {
    val queryRoot = new Path(id.checkpointRootLocation).getParent
    queryRoot != null && {
      val marker = new Path(queryRoot, CheckpointStore.SavepointMetadataFile)
      marker.getFileSystem(hadoopConf).exists(marker)
    }
  }

  /** No query writes into a savepoint: it is restored into a new checkpoint first. */
  private def refuseSavepoint(): Unit = if (inSavepoint) {
    throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"${id.checkpointRootLocation} is part of a " +
      s"savepoint (${CheckpointStore.SavepointMetadataFile} beside it), which no query writes: restore it into a " +
      "new checkpoint (keyedstate savepoint restore) and run the query there")
  }

  /** A store opened for writes belongs to a running query: say so to `keyedstate rescale`. */
  private def claimLease(): Unit =
    leaseRefreshedMs = StoreLease.refresh(checkpointStore.root, hadoopConf, leaseRefreshedMs)

  /** Waits for the store in use to finish; the same thread re-entering takes the instance over. */
  private def acquire(): Unit = {
    val timeoutMs = conf.acquireTimeoutMs
    val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs)
    while (activeStore != null && activeThread != Thread.currentThread()) {
      val waitMs = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())
      if (waitMs <= 0) {
        throw KeyedStateErrors.storeBusy(
          s"Timed out after $timeoutMs ms (${KeyedStateConf.Prefix}acquireTimeoutMs) waiting for state store " +
            s"$id: ${activeStore} is still in use by thread ${activeThread.getName}", activeThread.getName, timeoutMs)
      }
      wait(waitMs)
    }
    if (activeStore != null) {
      activeStore.invalidate()
      if (loaded != null && !loaded.servable) discardLoaded(s"$activeStore was taken over with writes")
      activeStore = null
    }
  }

  private[keyedstate] def finish(store: TaskStateStore, discardWrites: Boolean): Unit = synchronized {
    if (store eq activeStore) {
      if (loaded != null) loaded.db.releaseScanIterators()
      if (discardWrites && loaded != null && !loaded.servable) discardLoaded(s"$store ended with its writes dropped")
      activeStore = null
      activeThread = null
      notifyAll()
    }
  }

  /** Uncommitted writes are in the working RocksDB: drop it, the next load rebuilds it. */
  private def discardLoaded(reason: String): scala.concurrent.Future[Unit] = {
    val lost = if (loaded.db.healthy) "" else " (its RocksDB instance lost buffered writes)"
    logInfo(s"Dropping the loaded instance of $id at version ${lineage.version}: $reason$lost")
    CommittedViews.withdraw(this, storePartition, runId)
    loaded.close()
    loaded = null
    val uploads = lineage.close()
    lineage = null
    uploads
  }

  private def load(version: Long, checkpointId: Option[String], loadEmpty: Boolean): Unit = {
    val reuse = loaded != null && loaded.servable && lineage.version == version &&
      (checkpointId.isEmpty || checkpointId == lineage.checkpointId) && !loadEmpty
    if (reuse) {
      lastLoad = Some(LoadStats())
    } else {
      if (loaded != null) {
        discardLoaded(s"version $version${checkpointId.fold("")(c => s" (commit $c)")} asked for" +
          (if (loaded.servable) "" else ", and it holds writes not committed"))
      }
      val (next, stats) =
        if (loadEmpty || (version == 0 && !loader.bootstrapped)) (loader.empty(version), LoadStats())
        else loader.restore(version, checkpointId)
      loaded = next.instance
      lineage = next.lineage
      lastLoad = Some(stats)
    }
  }

  /**
   * Tells Spark's state store coordinator that a snapshot of `version` is durable. Without it the
   * coordinator sees the store as lagging and (forceSnapshotUploadOnLag, on by default) asks for
   * a snapshot on every commit after about 5 x minDeltasForSnapshot versions.
   */
  private def reportSnapshotUploaded(version: Long): Unit = {
    lastSnapshotUploaded = math.max(lastSnapshotUploaded, version)
    try {
      val runId = Option(hadoopConf.get(StreamExecution.RUN_ID_KEY)).map(UUID.fromString)
      runId.foreach { run =>
        KeyedStateCoordinatorBridge.snapshotUploaded(StateStoreProviderId(id, run), version, System.currentTimeMillis())
      }
    } catch {
      case NonFatal(e) => logWarning(s"Could not report the snapshot of version $version of $id: ${e.getMessage}")
    }
  }

  // ---- committing ----

  private[keyedstate] def commit(store: TaskStateStore): (Long, StateStoreCheckpointInfo) = synchronized {
    if (!(store eq activeStore)) {
      throw KeyedStateErrors.badState(ErrorId.StoreBusy, s"Cannot commit $store: the state store instance was taken over")
    }
    val newVersion = store.version + 1
    val commitId = UUID.randomUUID().toString
    try {
      val base = lineage.checkpointId
      // TTL cleanup first: its removals are ordinary writes of this version (changelog, key counts).
      val snapshot = lineage.snapshotPlanned(newVersion, loaded.describeColumnFamilies.map(_.numKeys).sum,
        store.forceSnapshot)
      loaded.ttlCleanup.beforeCommit(snapshot)
      loaded.db.throwIfWritesLost() // writes lost in the background fail the version before it is recorded
      loaded.db.releaseScanIterators() // they would pin the memtables the commit flushes
      // Queryable state reads this version while the next batch writes: its snapshot is taken now,
      // before the commit's flush, and published once the version is durable.
      val view = if (loaded.queryable) Some(loaded.db.snapshot()) else None
      filesLock.lock()
      val (_, stats) =
        try {
          val columnFamilies = loaded.describeColumnFamilies
          lineage.commit(loaded.db, loaded.takeChangelog(), columnFamilies, columnFamilies.map(_.numKeys).sum,
            newVersion, commitId, store.forceSnapshot || snapshot, loaded.ttlCleanup.cursorsForManifest,
            loaded.declaration)
        } catch {
          case e: Throwable => view.foreach(_.close()); throw e
        } finally filesLock.unlock()
      view.foreach(v => publishView(v, newVersion))
      lastTtl = loaded.ttl.stats
      loaded.dirty = false
      loaded.forgetKnownKeys()
      lastCommit = Some(stats.copy(forcedSnapshot = store.forceSnapshot && stats.snapshotTaken))
      logInfo(s"Committed $id version $newVersion: $stats")
      StoreApi.reportCommit(storeConf, newVersion, id, hadoopConf)
      val info =
        if (conf.checkpointIdsEnabled) StateStoreCheckpointInfo(id.partitionId, newVersion, Some(commitId), base)
        else StateStoreCheckpointInfo(id.partitionId, newVersion, None, None)
      (newVersion, info)
    } catch {
      case NonFatal(e) =>
        discardLoaded(s"the commit of version $newVersion failed: ${KeyedStateError.detailOf(e)}")
        throw KeyedStateErrors.cannotCommit(id, newVersion, e)
    } finally {
      activeStore = null
      activeThread = null
      notifyAll()
    }
  }

  private lazy val storePartition =
    StorePartition(id.checkpointRootLocation, id.operatorId, id.partitionId, id.storeName)
  private lazy val runId = Option(hadoopConf.get(StreamExecution.RUN_ID_KEY)).getOrElse("")

  /**
   * Lookups read `store`'s committed versions from now on (queryable state): the version it
   * loaded is published at once unless this JVM holds it already (a restart, a retried batch or a
   * partition moved here serves lookups before its first commit); each commit publishes its own.
   */
  private[keyedstate] def makeQueryable(store: TaskStateStore): Unit = synchronized {
    if ((store eq activeStore) && loaded != null) {
      loaded.queryable = true
      if (loaded.dirty) ()
      else if (CommittedViews.holds(storePartition, runId, store.version)) {
        CommittedViews.announce(storePartition, runId, store.version) // the driver routes here again
      } else publishView(loaded.db.snapshot(), store.version)
    }
  }

  /**
   * Publishes `snapshot` as committed `version`, TTL judged by the time of batch `version - 1`
   * (read only when a family hides expired entries). A failure is logged: the version is durable,
   * only lookups of it are lost.
   */
  private def publishView(snapshot: DbSnapshot, version: Long): Unit = {
    val instance = loaded
    try {
      // Every family of the database, a restored one's included (described by the manifest until
      // the task registers it): whether a family holds lists decides how TTL reads its values.
      val multi = instance.db.columnFamilies.map(cf => cf -> instance.isMultiValue(cf)).toMap
      val (root, conf) = (id.checkpointRootLocation, hadoopConf)
      CommittedViews.publish(this, new CommittedView(storePartition, runId, version, snapshot, instance.ttl,
        () => TtlClock.at(root, version - 1, conf), multi))
    } catch {
      case NonFatal(e) =>
        snapshot.release()
        logWarning(s"Lookups cannot read version $version of $id: ${e.getMessage}", e)
    }
  }

  /** Tests only: blocks until a background snapshot upload of the loaded instance finished. */
  private[keyedstate] def awaitSnapshotUpload(): Unit = synchronized {
    if (lineage != null) lineage.awaitPendingSnapshot()
  }

  /** Tests only: entries physically in the working RocksDB, expired ones included. */
  private[keyedstate] def rawEntryCount(cf: String = StateStore.DEFAULT_COL_FAMILY_NAME): Long = synchronized {
    val it = loaded.db.scan(cf, None, None)
    try it.size.toLong finally it.close()
  }

  /**
   * Benchmarks only (bench/jvm): flushes and fully compacts the loaded instance's working RocksDB,
   * the same file layout as a raw RocksDB compacted alike. Between batches only: no store may be open.
   */
  private[keyedstate] def compactWorkingDb(): Unit = synchronized {
    if (activeStore != null && activeStore.isOpen) throw new IllegalStateException(s"$activeStore is open")
    loaded.db.flush()
    loaded.db.compactRange()
  }

  /** Tests only: the loaded instance's working RocksDB (to inject faults into), or null. */
  private[keyedstate] def loadedDbForTest: LocalRocksDB = synchronized(if (loaded == null) null else loaded.db)

  /** Tests only: the working RocksDB's directory (to look at its SST files). */
  private[keyedstate] def workingDbDir: File = dbDir

  // ---- metrics ----

  private[keyedstate] def metrics: StateStoreMetrics = synchronized {
    val (keys, memory, sst) =
      if (loaded == null) (0L, 0L, 0L)
      else (loaded.numUserKeys, loaded.db.memoryUsageBytes, loaded.db.totalSstFilesBytes)
    StoreApi.metrics(keys, memory, KeyedStateMetrics.of(lastCommit, lastLoad, sst, lastTtl), id, lastSnapshotUploaded)
  }

  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] = KeyedStateMetrics.all

  // ---- maintenance ----

  /**
   * Deletes versions older than `minBatchesToRetain` and files no retained version needs; skipped
   * while a commit of this store runs (the next maintenance run cleans up). A failure is thrown
   * to Spark, which unloads this store alone.
   */
  override def cleanupMaintenance(): Unit = {
    if (leaseRefreshedMs > 0) {
      leaseRefreshedMs = StoreLease.refresh(checkpointStore.root, hadoopConf, leaseRefreshedMs, keepAliveOnly = true)
    }
    if (filesLock.tryLock()) {
      val stats =
        try {
          val current = lineage
          cleaner.cleanup(if (current == null) _ => false else current.neededFiles)
        } finally filesLock.unlock()
      if (stats.manifestsDeleted + stats.filesDeleted > 0) logInfo(s"Cleaned up $id: $stats")
    } else logInfo(s"Cleanup of $id skipped: a commit is in progress; the next maintenance run cleans up")
    backgroundTtlScan()
  }

  /**
   * TTL's background cleanup: a read-only scan of the loaded instance, concurrent with the task
   * using it; what it finds is removed by the next commit (which checks each entry again).
   */
  private[keyedstate] def backgroundTtlScan(): Int = {
    val instance = loaded
    if (instance == null) 0
    else {
      try {
        val found = instance.ttlCleanup.backgroundScan()
        if (found > 0) logInfo(s"TTL background cleanup of $id found $found expired entries for the next commit")
        found
      } catch {
        // E.g. a column family dropped by the task meanwhile: the next maintenance run tries again.
        case NonFatal(e) =>
          logWarning(s"TTL background cleanup of $id skipped: ${e.getMessage}")
          0
      }
    }
  }

  override def close(): Unit = synchronized {
    if (leaseRefreshedMs > 0) StoreLease.release(checkpointStore.root, hadoopConf)
    val uploads = if (loaded != null) discardLoaded("the provider is unloaded") else scala.concurrent.Future.unit
    if (localRoot != null) {
      LocalFiles.deleteRecursively(dbDir)
      // A background snapshot upload still reads its checkpoint under the work directory.
      val root = localRoot
      uploads.onComplete(_ => LocalFiles.deleteRecursively(root))(scala.concurrent.ExecutionContext.parasitic)
    }
  }

  override def toString: String = s"KeyedStateStoreProvider[$id]"
}

object KeyedStateStoreProvider {
  /** The state stores of a stream-stream join (v1/v2): `<side>-keyToNumValues`, `<side>-keyWithIndexToValue`. */
  private val JoinStoreNames = Set("keyToNumValues", "keyWithIndexToValue").flatMap(n => Seq(s"left-$n", s"right-$n"))

  /**
   * A join keeps, per key, a count in one store and the indexed values in another; expiring
   * entries of either independently of the other would corrupt the join's bookkeeping (counts
   * pointing at missing values, values beyond the count), so TTL is refused on join state.
   */
  private def refuseTtlOnJoinState(id: StateStoreId, conf: KeyedStateConf): Unit =
    if (JoinStoreNames(id.storeName) && conf.ttl.anyEnabledFor(id.operatorId, StateStore.DEFAULT_COL_FAMILY_NAME)) {
      throw KeyedStateErrors.invalidOption(
        s"keyedstate TTL cannot be used for operator ${id.operatorId}: it is a stream-stream join " +
          s"(state store '${id.storeName}'), whose two stores (keyToNumValues and keyWithIndexToValue) " +
          "must stay consistent, and expiring their entries independently would corrupt the join's state. " +
          "Join state is cleaned by the join's watermark condition instead. Disable TTL for this operator " +
          s"with ${KeyedStateConf.Prefix}ttl.operator.${id.operatorId}.duration=none")
    }

  /** Distinguishes this JVM's files from those of other executors sharing the local disk. */
  private val jvmDirName = s"jvm-${UUID.randomUUID()}"
  private val jvmDirsToClean = java.util.concurrent.ConcurrentHashMap.newKeySet[File]()

  /**
   * `<base>/keyedstate/jvm-<uuid>`: this executor's working instances and local file cache, under
   * `localDir` if set, else the executor's first Spark local directory, else java.io.tmpdir.
   * Local recovery serves executors that live on, so the folder is removed when the JVM exits.
   */
  private[keyedstate] def localBaseDir(conf: KeyedStateConf): File = {
    val sparkLocal = Option(SparkEnv.get).flatMap(_.conf.getOption("spark.local.dir"))
    val base = conf.localDir
      .orElse(sys.env.get("LOCAL_DIRS"))
      .orElse(sys.env.get("SPARK_LOCAL_DIRS"))
      .orElse(sparkLocal)
      .map(_.split(",").head.trim)
      .getOrElse(System.getProperty("java.io.tmpdir"))
    val dir = new File(new File(base, KeyedStateConf.LocalSubdir), jvmDirName)
    if (jvmDirsToClean.add(dir)) sys.addShutdownHook(LocalFiles.deleteRecursively(dir))
    dir
  }
}
