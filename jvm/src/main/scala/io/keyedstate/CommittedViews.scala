package io.keyedstate

import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.CopyOnWriteArrayList

import scala.util.control.NonFatal

import io.keyedstate.rocks.DbSnapshot
import io.keyedstate.ttl.{BatchTime, TtlState}

/** A store partition of a query, as a lookup names it: the same across the query's runs. */
final case class StorePartition(checkpointRoot: String, operatorId: Long, partitionId: Int, storeName: String) {
  override def toString: String = s"operator $operatorId, partition $partitionId, store $storeName of $checkpointRoot"
}

/**
 * One committed version of a store partition that other threads read while the query's next
 * batch writes (queryable state): a RocksDB snapshot of the version, with TTL judged at the time
 * of the batch that committed it. `version` is the store version; it holds the state after
 * batch `version - 1`. Published by the run `runId` of the query.
 */
final class CommittedView private[keyedstate] (
    val partition: StorePartition,
    val runId: String,
    val version: Long,
    snapshot: DbSnapshot,
    ttl: TtlState,
    batchTime: () => BatchTime,
    multipleValues: Map[String, Boolean]) {

  def batchId: Long = version - 1

  @volatile private var timeKnown = false
  private lazy val time = { val t = batchTime(); timeKnown = true; t }

  private def multi(cf: String) = multipleValues.getOrElse(cf, false)

  /** Whether a read of `cf` needs no file read first (its TTL's batch time is known, or it has no TTL). */
  def readsWithoutIo(cf: String): Boolean = timeKnown || !ttl.config(cf).hidesExpired

  /** The stored value of `key` in `cf` (TTL's hidden elements left out), or null. */
  def get(cf: String, key: Array[Byte]): Array[Byte] = ttl.visibleAt(cf, multi(cf), snapshot.get(cf, key), time)

  /** Up to `limit` visible entries of `cf` under `prefix`, and whether more follow. */
  def prefixScan(cf: String, prefix: Array[Byte], limit: Int): (Seq[(Array[Byte], Array[Byte])], Boolean) = {
    val (entries, more) = snapshot.prefixScan(cf, prefix, limit)
    (entries.flatMap { case (k, v) => Option(ttl.visibleAt(cf, multi(cf), v, time)).map(k -> _) }, more)
  }

  /** `body` with the view kept readable until it returns (a newer version may replace it meanwhile). */
  def reading[T](body: => T): T = snapshot.reading("read a committed view")(body)

  /** Gives the view up: the reads in flight finish, the last releases the snapshot. */
  def release(): Unit = snapshot.release()

  override def toString: String = s"version $version of $partition (run $runId)"
}

/**
 * The committed views this JVM holds, by store partition and query run: the last two versions
 * each run's loaded provider published (a lookup reads the version of the batch the query's
 * commit log last recorded, which is the latest or, while a batch commits, the one before). A
 * provider publishes a view when it loads a version and at each commit, and withdraws its views
 * when it drops its instance. Listeners (the executor's state server) learn when a partition
 * starts or stops being held here.
 */
object CommittedViews {
  /** Versions kept per partition and run. */
  val Kept = 2

  trait Listener {
    /** `version` of `partition` by run `runId` is held here (published, or loaded again). */
    def held(partition: StorePartition, runId: String, version: Long): Unit
    def released(partition: StorePartition, runId: String): Unit
  }

  // The views of one partition and run, newest last, and the provider that published them.
  private final case class Held(owner: AnyRef, views: List[CommittedView])

  private val held = new ConcurrentHashMap[(StorePartition, String), Held]()
  private val listeners = new CopyOnWriteArrayList[Listener]()
  private val logger = org.slf4j.LoggerFactory.getLogger(getClass)

  def addListener(l: Listener): Unit = listeners.add(l)
  def removeListener(l: Listener): Unit = listeners.remove(l)

  /** The partitions held here, each with the run that published it. */
  def partitions: Seq[(StorePartition, String)] = {
    val out = Seq.newBuilder[(StorePartition, String)]
    held.forEach((key, _) => out += key)
    out.result()
  }

  /** Whether version `version` of `partition` by run `runId` is held here. */
  def holds(partition: StorePartition, runId: String, version: Long): Boolean =
    versions(partition, runId).contains(version)

  /**
   * Publishes `view` of `owner`'s instance; the views before the last [[Kept]] are released.
   * Another provider of the same partition and run (a reloaded instance) replaces the views of
   * the one before it.
   */
  private[keyedstate] def publish(owner: AnyRef, view: CommittedView): Unit = {
    var dropped: List[CommittedView] = Nil
    held.compute((view.partition, view.runId), (_, before) => {
      val sameOwner = before != null && (before.owner eq owner)
      val previous = if (before == null) Nil else before.views
      val kept = (if (sameOwner) previous.filter(_.version < view.version) else Nil) :+ view
      val views = kept.takeRight(Kept)
      dropped = previous.filterNot(views.contains)
      Held(owner, views)
    })
    dropped.foreach(releaseQuietly)
    announce(view.partition, view.runId, view.version)
  }

  /** Tells the listeners that `version` of `partition` by run `runId` is held here. */
  private[keyedstate] def announce(partition: StorePartition, runId: String, version: Long): Unit =
    listeners.forEach(l => notify(l.held(partition, runId, version)))

  /** Withdraws the views `owner` published of `partition` for run `runId` (its instance is being dropped). */
  private[keyedstate] def withdraw(owner: AnyRef, partition: StorePartition, runId: String): Unit = {
    var removed: Held = null
    held.computeIfPresent((partition, runId), (_, h) => if (h.owner eq owner) { removed = h; null } else h)
    if (removed != null) {
      removed.views.foreach(releaseQuietly)
      listeners.forEach(l => notify(l.released(partition, runId)))
    }
  }

  /** The versions held of `partition` by run `runId`, oldest first (empty when none is held here). */
  def versions(partition: StorePartition, runId: String): Seq[Long] =
    Option(held.get((partition, runId))).toSeq.flatMap(_.views.map(_.version))

  /**
   * `read` on version `version` of `partition` by run `runId`, if it is held here; waits up to
   * `waitMs` for a commit to publish it. A view released meanwhile (a newer commit, an unload)
   * makes the read fail with the store's "released" error: the caller asks again.
   */
  def read[T](partition: StorePartition, runId: String, version: Long, waitMs: Long)(
      read: CommittedView => T): Option[T] = {
    val deadline = System.nanoTime() + waitMs * 1000000L
    var found = viewAt(partition, runId, version)
    while (found.isEmpty && System.nanoTime() < deadline && versions(partition, runId).forall(_ < version)) {
      Thread.sleep(2)
      found = viewAt(partition, runId, version)
    }
    found.map(v => v.reading(read(v)))
  }

  /** Whether version `version` of `partition` by run `runId` is held here and reads `cf` without a file read. */
  def readyAt(partition: StorePartition, runId: String, version: Long, cf: String): Boolean =
    viewAt(partition, runId, version).exists(_.readsWithoutIo(cf))

  private def viewAt(partition: StorePartition, runId: String, version: Long): Option[CommittedView] =
    Option(held.get((partition, runId))).flatMap(_.views.find(_.version == version))

  private def releaseQuietly(v: CommittedView): Unit =
    try v.release() catch { case NonFatal(e) => logger.warn(s"Could not release $v", e) }

  private def notify(body: => Unit): Unit =
    try body catch { case NonFatal(e) => logger.warn("A committed-view listener failed", e) }
}
