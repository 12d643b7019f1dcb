package io.keyedstate.queryable

import java.io.File
import java.util.UUID
import java.util.concurrent.{CompletableFuture, RejectedExecutionException, TimeUnit}
import java.util.concurrent.locks.ReentrantLock

import scala.jdk.CollectionConverters._

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.{StateStore, StateStoreConf, StateStoreId}
import org.apache.spark.sql.internal.SQLConf

import io.keyedstate.{CommittedView, CommittedViews, KeyedStateStoreProvider, StoreInstance, StorePartition}
import io.keyedstate.checkpoint.{CheckpointStore, LocalFileCache, LocalFiles, Transfers, VersionManifest}
import io.keyedstate.checkpoint.commit.Changelog
import io.keyedstate.checkpoint.restore.RestoreOperation
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.offline.{QueryCheckpoint, StateTable, StateTables}
import io.keyedstate.ttl.TtlClock

/**
 * The checkpoint fallback of lookups, in the driver: a store partition no state server holds (a
 * stopped query, a partition between executors) is read from the query's committed checkpoint.
 * The first lookup of a partition rebuilds its version into a local RocksDB as the provider loads
 * one (snapshot files, then changelogs); later versions replay only their new changelogs on it
 * (a new base snapshot rebuilds it). Each version is published as a committed view of a run of its
 * own (`checkpoint:<id>`) and read as the executors' views are, so TTL and encodings are judged alike. A version
 * whose files are missing or damaged is reported, and the last good version is served meanwhile.
 * It never writes to the checkpoint. At most [[MaxPartitions]] partitions are kept open.
 */
final class CheckpointViews extends AutoCloseable {
  import CheckpointViews._

  // Access-ordered: the least recently read partition is closed first.
  private val followers = new java.util.LinkedHashMap[StorePartition, Follower](16, 0.75f, true)
  private var closed = false
  // Rebuilds and replays run here, off the callers' pools (the JVM's common pool included).
  private val readers = Transfers.daemonPool("keyedstate-checkpoint-lookups", ReaderThreads)

  /**
   * `read` answered from version `read.version` of the checkpoint at `checkpointRoot`, or from the
   * last good version before it when that one's files cannot be read (with the reason); waits for
   * another lookup's rebuild of the partition until `deadline` (`System.nanoTime`).
   */
  def read(checkpointRoot: String, settings: () => Settings, read: ViewRead, deadline: Long): Served = {
    // A follower closed under the read (evicted, the service stopping) is asked again, once.
    def attempt(left: Int): Served = {
      val follower = followerOf(read.partition, checkpointRoot, settings)
      try {
        val (version, problem) = follower.advanceTo(read.version, deadline)
        Served(version, StateServer.read(read.copy(runId = follower.run, version = version, waitMs = 0)), problem)
      } catch {
        case _: StateServer.Refused | Closed if left > 0 => attempt(left - 1)
      }
    }
    attempt(1)
  }

  /** `read`, on this reader's own threads. */
  def readAsync(checkpointRoot: String, settings: () => Settings, read: ViewRead,
      deadline: Long): CompletableFuture[Served] =
    try CompletableFuture.supplyAsync(() => this.read(checkpointRoot, settings, read, deadline), readers)
    catch { case _: RejectedExecutionException => CompletableFuture.failedFuture(stopping) }

  private def stopping = new IllegalStateException("the query service is stopping")

  private def followerOf(partition: StorePartition, checkpointRoot: String, settings: () => Settings): Follower = {
    var evicted: Option[Follower] = None
    val follower = followers.synchronized {
      if (closed) throw stopping
      val found = Option(followers.get(partition)).getOrElse {
        val (sqlConf, hadoopConf) = settings() // only a new follower needs them: they cost a copy
        val created = new Follower(partition, checkpointRoot, sqlConf, hadoopConf)
        followers.put(partition, created)
        created
      }
      if (followers.size > MaxPartitions) {
        val eldest = followers.entrySet().iterator()
        evicted = Some(eldest.next().getValue)
        eldest.remove()
      }
      found
    }
    // Off the map's lock and this lookup: closing waits for the follower's rebuild or reads.
    evicted.foreach(f => try readers.execute(() => f.close()) catch { case _: RejectedExecutionException => f.close() })
    follower
  }

  override def close(): Unit = {
    val all = followers.synchronized {
      closed = true
      val all = followers.values().asScala.toList
      followers.clear()
      all
    }
    readers.shutdownNow() // rebuilds in progress are interrupted
    all.foreach(_.close())
  }

  /**
   * One partition followed from its checkpoint: the version loaded, and the last failure to load
   * another. Closed once (evicted, the service stopping): later calls throw [[Closed]].
   */
  private final class Follower(partition: StorePartition, checkpointRoot: String, sqlConf: SQLConf,
      hadoopConf: Configuration) {
    private val id = StateStoreId(partition.checkpointRoot, partition.operatorId, partition.partitionId,
      partition.storeName)
    private val store = new CheckpointStore(new Path(id.storeCheckpointLocation().toString), hadoopConf)
    private val lock = new ReentrantLock()
    // Its views' run: its own, so that a follower evicted while it rebuilds never touches the
    // views of the follower replacing it.
    val run = s"$Run:${UUID.randomUUID()}"
    private var loaded: Loaded = _
    private var failure: Option[Failure] = None
    private var closed = false

    /**
     * The version served for `version`: itself, or the last good one before it and why `version`
     * cannot be read. Waits for the partition's rebuild by another lookup until `deadline`.
     */
    def advanceTo(version: Long, deadline: Long): (Long, Option[String]) = {
      if (!lock.tryLock(math.max(0L, deadline - System.nanoTime()), TimeUnit.NANOSECONDS)) {
        throw new IllegalStateException(s"$partition is being read from the checkpoint by another lookup, which " +
          "took longer than this one's timeout; ask again")
      }
      try {
        if (closed) throw Closed
        if (CommittedViews.holds(partition, run, version)) (version, None)
        else failure.filter(f => f.version == version && System.nanoTime() - f.atNanos < RetryNanos) match {
          case Some(f) => servedBefore(version, f.message)
          case None =>
            try {
              val manifest = manifestOf(version)
              if (loaded != null && !loaded.broken && extends_(loaded.manifest, manifest)) replayOnto(manifest)
              else rebuild(manifest)
              failure = None
              (version, None)
            } catch {
              case NonFatal(e) =>
                val message = s"version $version of $partition cannot be read from the checkpoint: ${e.getMessage}"
                failure = Some(Failure(version, message, System.nanoTime()))
                logger.warn(message, e)
                servedBefore(version, message)
            }
        }
      } finally lock.unlock()
    }

    /** The version loaded, if it is older than `version` (never a newer one): why `version` is not served. */
    private def servedBefore(version: Long, message: String): (Long, Option[String]) =
      Option(loaded).map(_.manifest.version).filter(_ < version) match {
        case Some(last) if CommittedViews.holds(partition, run, last) => (last, Some(message))
        case _ => throw new IllegalStateException(message)
      }

    /** Version `version`'s manifest: by the checkpoint id the commit log records for it (format v2), or by version. */
    private def manifestOf(version: Long): VersionManifest = {
      val ckpt = new QueryCheckpoint(new Path(checkpointRoot), hadoopConf)
      val checkpointId = ckpt.defaultStoreCheckpointIds(version - 1, partition.operatorId.toInt,
        Seq(partition.partitionId)).get(partition.partitionId)
      store.readManifest(version, checkpointId)
    }

    /**
     * Whether `next` is `current` and more changelogs: the same base snapshot, the older logs
     * kept, and the same declaration and column families (TTL and list-ness are read at rebuild).
     */
    private def extends_(current: VersionManifest, next: VersionManifest): Boolean = {
      def families(m: VersionManifest) = m.columnFamilies.map(_.copy(numKeys = 0)).toSet
      next.version > current.version && next.snapshotVersion == current.snapshotVersion &&
        next.files == current.files && next.changelogs.startsWith(current.changelogs) &&
        next.declaration == current.declaration && families(next) == families(current)
    }

    private def replayOnto(manifest: VersionManifest): Unit = {
      val logs = manifest.changelogs.drop(loaded.manifest.changelogs.size)
      val replayDir = new File(loaded.dir, s"replay-${UUID.randomUUID()}")
      try {
        val fetched = loaded.restores.fetchInto(logs.map(_.file), manifest.version, replayDir)(_.path.replace('/', '_'))
        // Checked by size and checksum above: a replay failing now leaves the database half-written.
        loaded.broken = true
        logs.zip(fetched).foreach { case (log, (local, _)) =>
          Changelog.replay(local, loaded.instance.db, store.resolve(log.file.path).toString, log.version)
        }
        loaded.broken = false
      } finally LocalFiles.deleteRecursively(replayDir)
      loaded.manifest = manifest
      loaded.cache.retainOnly(manifest.allFiles)
      publish(loaded)
    }

    private def rebuild(manifest: VersionManifest): Unit = {
      val table = tableOf(manifest.version - 1)
      val conf = KeyedStateConf(new StateStoreConf(sqlConf, table.ttlOptions))
      val base = new File(KeyedStateStoreProvider.localBaseDir(conf), "lookups")
      val dir = new File(base, UUID.randomUUID().toString)
      var instance: StoreInstance = null
      try {
        val cache = LocalFileCache.forStore(new File(base, "cache"), store.root.toString)
        val restores = new RestoreOperation(store, cache, conf)
        val (db, _) = restores.rebuild(manifest, new File(dir, "db"), dir, s"$partition")
        try {
          instance = new StoreInstance(db, partition.storeName, conf, table.columnFamilies, manifest.columnFamilies,
            None, cf => conf.ttl.forColumnFamily(partition.operatorId, cf), manifest.ttlCursors, manifest.declaration)
        } catch { case NonFatal(e) => db.close(); throw e }
        instance.registerCodec(StateStore.DEFAULT_COL_FAMILY_NAME, table.storeKeySchema, table.storeValueSchema,
          table.storeSpec, multipleValues = false, isInternal = false)
        cache.retainOnly(manifest.allFiles)
        val next = new Loaded(manifest, instance, restores, cache, dir)
        publish(next) // replaces the views of the instance before, which closes once its reads finish
        val before = loaded
        loaded = next
        if (before != null) before.close()
      } catch {
        case NonFatal(e) =>
          if (instance != null) instance.close()
          LocalFiles.deleteRecursively(dir)
          throw e
      }
    }

    /** The table whose store this partition is, as the checkpoint declares it at `batch`. */
    private def tableOf(batch: Long): StateTable = {
      val ckpt = new QueryCheckpoint(new Path(checkpointRoot), hadoopConf)
      val (_, tables) = StateTables(ckpt, batch).operatorOf(partition.operatorId.toString)
      tables.find(_.storeName == partition.storeName).getOrElse(throw new IllegalStateException(
        s"the checkpoint $checkpointRoot declares no store '${partition.storeName}' of operator ${partition.operatorId}"))
    }

    private def publish(l: Loaded): Unit = {
      val version = l.manifest.version
      val multi = l.instance.db.columnFamilies.map(cf => cf -> l.instance.isMultiValue(cf)).toMap
      CommittedViews.publish(l, new CommittedView(partition, run, version, l.instance.db.snapshot(), l.instance.ttl,
        () => TtlClock.at(partition.checkpointRoot, version - 1, hadoopConf), multi))
    }

    def close(): Unit = {
      lock.lock()
      try {
        closed = true
        if (loaded != null) {
          CommittedViews.withdraw(loaded, partition, run)
          loaded.close()
          loaded = null
        }
      } finally lock.unlock()
    }
  }
}

object CheckpointViews {
  private val logger = org.slf4j.LoggerFactory.getLogger(classOf[CheckpointViews])

  /** What the run ids of the checkpoint's views start with (a query run's are UUIDs). */
  val Run = "checkpoint"

  /** Whether `runId` is a follower's, not a query run's. */
  def isCheckpointRun(runId: String): Boolean = runId.startsWith(Run + ":")
  /** Partitions kept open in the driver; the least recently read is closed past it. */
  val MaxPartitions = 64
  /** Threads rebuilding or reading partitions from the checkpoint at once. */
  private val ReaderThreads = 4
  /** How long a version that failed to load is not tried again (each lookup would otherwise try). */
  private val RetryNanos = 5L * 1000 * 1000 * 1000

  /** The query's session settings a follower reads the checkpoint with. */
  type Settings = (SQLConf, Configuration)

  /** What the checkpoint served: the version read, the answer, and why it is older than asked (if it is). */
  final case class Served(version: Long, answer: ViewAnswer, problem: Option[String])

  private final case class Failure(version: Long, message: String, atNanos: Long)

  /** A follower closed under a lookup: the lookup asks a new one. */
  private object Closed extends Exception("closed", null, false, false)

  /** A version loaded in a local RocksDB of its own (`dir`), rebuilt with `restores` from `cache`. */
  private final class Loaded(@volatile var manifest: VersionManifest, val instance: StoreInstance,
      val restores: RestoreOperation, val cache: LocalFileCache, val dir: File) {
    @volatile var broken: Boolean = false
    def close(): Unit = try instance.close() finally LocalFiles.deleteRecursively(dir)
  }
}
