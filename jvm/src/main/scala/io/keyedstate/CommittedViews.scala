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
 * batch writes (queryable state): a RocksDB snapshot taken at the commit, with TTL judged at the
 * version's batch time. `version` is the store version; it holds the state after batch
 * `version - 1`.
 */
final class CommittedView private[keyedstate] (
    val partition: StorePartition,
    val runId: String,
    val version: Long,
    snapshot: DbSnapshot,
    ttl: TtlState,
    batchTime: Option[BatchTime],
    multipleValues: String => Boolean) extends AutoCloseable {

  def batchId: Long = version - 1

  private def time: BatchTime = batchTime.getOrElse(throw new IllegalStateException(
    s"version $version of $partition has no batch time to judge TTL by"))

  /** The stored value of `key` in `cf` (TTL's hidden elements left out), or null. */
  def get(cf: String, key: Array[Byte]): Array[Byte] =
    ttl.visibleAt(cf, multipleValues(cf), snapshot.get(cf, key), time)

  /** Up to `limit` visible entries of `cf` under `prefix`, and whether more follow. */
  def prefixScan(cf: String, prefix: Array[Byte], limit: Int): (Seq[(Array[Byte], Array[Byte])], Boolean) = {
    val (entries, more) = snapshot.prefixScan(cf, prefix, limit)
    val multi = multipleValues(cf)
    (entries.flatMap { case (k, v) => Option(ttl.visibleAt(cf, multi, v, time)).map(k -> _) }, more)
  }

  override def close(): Unit = snapshot.close()

  override def toString: String = s"version $version of $partition"
}

/**
 * The committed views this JVM holds, by store partition: the last two versions each loaded
 * provider committed (a lookup reads the version of the batch the query's commit log last
 * recorded, which is the latest or, while a batch commits, the one before). A provider publishes
 * a view at each commit and withdraws its views when it drops its instance. Listeners (the
 * executor's state server) learn when a partition starts or stops being held here.
 */
object CommittedViews {
  /** Versions kept per partition. */
  val Kept = 2

  trait Listener {
    def held(partition: StorePartition, runId: String): Unit
    def released(partition: StorePartition, runId: String): Unit
  }

  // The views of one partition, newest last, and the provider that published them.
  private final case class Held(owner: AnyRef, runId: String, views: List[CommittedView])

  private val held = new ConcurrentHashMap[StorePartition, Held]()
  private val listeners = new CopyOnWriteArrayList[Listener]()
  private val logger = org.slf4j.LoggerFactory.getLogger(getClass)

  def addListener(l: Listener): Unit = listeners.add(l)
  def removeListener(l: Listener): Unit = listeners.remove(l)

  /** The partitions held here, with the run of the query that published them. */
  def partitions: Map[StorePartition, String] = {
    val out = Map.newBuilder[StorePartition, String]
    held.forEach((p, h) => out += p -> h.runId)
    out.result()
  }

  /** Publishes `view` of `owner`'s instance; the views before the last [[Kept]] are released. */
  private[keyedstate] def publish(owner: AnyRef, view: CommittedView): Unit = {
    var dropped: List[CommittedView] = Nil
    var fresh = false
    held.compute(view.partition, (_, before) => {
      val sameOwner = before != null && (before.owner eq owner)
      // Another provider's views (an earlier run's, a reloaded instance's) end with the new owner's first.
      val kept = if (sameOwner) before.views.filter(_.version < view.version) else Nil
      if (!sameOwner && before != null) dropped = before.views
      fresh = !sameOwner
      val views = (kept :+ view).takeRight(Kept)
      dropped = dropped ++ kept.filterNot(views.contains)
      Held(owner, view.runId, views)
    })
    dropped.foreach(closeQuietly)
    if (fresh) listeners.forEach(l => notify(l.held(view.partition, view.runId)))
  }

  /** Withdraws the views `owner` published of `partition` (its instance is being dropped). */
  private[keyedstate] def withdraw(owner: AnyRef, partition: StorePartition): Unit = {
    var removed: Held = null
    held.computeIfPresent(partition, (_, h) => if (h.owner eq owner) { removed = h; null } else h)
    if (removed != null) {
      removed.views.foreach(closeQuietly)
      listeners.forEach(l => notify(l.released(partition, removed.runId)))
    }
  }

  /** The versions held of `partition`, oldest first (empty when it is not held here). */
  def versions(partition: StorePartition): Seq[Long] = Option(held.get(partition)).toSeq.flatMap(_.views.map(_.version))

  /**
   * `read` on version `version` of `partition`, if it is held here; waits up to `waitMs` for a
   * commit to publish it. A view released meanwhile (a newer commit, an unload) makes the read
   * fail with the store's "released" error: the caller asks again.
   */
  def read[T](partition: StorePartition, version: Long, waitMs: Long)(read: CommittedView => T): Option[T] = {
    val deadline = System.nanoTime() + waitMs * 1000000L
    var found = viewAt(partition, version)
    while (found.isEmpty && System.nanoTime() < deadline && versions(partition).forall(_ < version)) {
      Thread.sleep(2)
      found = viewAt(partition, version)
    }
    found.map(read)
  }

  private def viewAt(partition: StorePartition, version: Long): Option[CommittedView] =
    Option(held.get(partition)).flatMap(_.views.find(_.version == version))

  private def closeQuietly(v: CommittedView): Unit =
    try v.close() catch { case NonFatal(e) => logger.warn(s"Could not release $v", e) }

  private def notify(body: => Unit): Unit =
    try body catch { case NonFatal(e) => logger.warn("A committed-view listener failed", e) }
}
