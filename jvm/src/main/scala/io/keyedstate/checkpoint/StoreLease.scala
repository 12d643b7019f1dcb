package io.keyedstate.checkpoint

import java.nio.charset.StandardCharsets.UTF_8
import java.util.concurrent.ConcurrentHashMap

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.SparkEnv
import org.apache.spark.internal.Logging
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

import io.keyedstate.shims.SparkTypes.StreamExecution

/** Who holds a store partition: written by the provider that has it loaded. */
final case class LeaseHolder(
    applicationId: String,
    queryRunId: String,
    executorId: String,
    host: String,
    refreshedAtMs: Long)

/**
 * A running query's claim on its store partitions: `<store dir>/.keyedstate-lease`, written when a
 * task opens the store for writes and kept alive by the provider's maintenance (at least every
 * `spark.sql.streaming.stateStore.maintenanceInterval`), removed when the query stops (the
 * driver's [[io.keyedstate.QueryLeaseListener]], installed by `keyedstate.configure`), when the
 * provider closes or when its executor shuts down. Maintenance never creates a lease, so one
 * removed at the query's stop stays removed. `keyedstate rescale` refuses a checkpoint with a
 * fresh lease of another application: that query is running. A lease left by a killed executor
 * goes stale after [[StoreLease.StaleAfterMs]].
 */
object StoreLease extends Logging {
  val FileName = ".keyedstate-lease"
  /** Three default maintenance intervals without a refresh: the holder is gone. */
  val StaleAfterMs: Long = 3 * 60 * 1000L
  private val RefreshEveryMs = 30 * 1000L

  private implicit val formats: Formats = DefaultFormats
  // The leases this JVM wrote, and as whom: the shutdown hook removes those still its own.
  private val held = new ConcurrentHashMap[Path, (Configuration, LeaseHolder)]()
  sys.addShutdownHook(held.forEach((p: Path, held: (Configuration, LeaseHolder)) => deleteIfHeldBy(p, held._1, held._2)))

  def path(storeDir: Path): Path = new Path(storeDir, FileName)

  /** This provider as a lease names it: the application, the query run (of `hadoopConf`), the executor. */
  private def self(hadoopConf: Configuration, now: Long): LeaseHolder = {
    val env = Option(SparkEnv.get)
    LeaseHolder(
      env.map(_.conf.getAppId).getOrElse("unknown"),
      Option(hadoopConf.get(StreamExecution.RUN_ID_KEY)).getOrElse("unknown"),
      env.map(_.executorId).getOrElse("unknown"),
      java.net.InetAddress.getLocalHost.getHostName,
      now)
  }

  private def sameHolder(a: LeaseHolder, b: LeaseHolder): Boolean =
    a.applicationId == b.applicationId && a.queryRunId == b.queryRunId && a.executorId == b.executorId

  private def read(p: Path, hadoopConf: Configuration): Option[LeaseHolder] =
    try {
      val in = p.getFileSystem(hadoopConf).open(p)
      try Some(Serialization.read[LeaseHolder](new String(in.readAllBytes(), UTF_8))) finally in.close()
    } catch { case NonFatal(_) => None }

  /**
   * Claims or refreshes the lease (skipped when refreshed recently); never fails the caller. A
   * task that opens the store for writes claims it. Maintenance (`keepAliveOnly`) refreshes only
   * a lease that is still this provider's: one removed when the query stopped stays removed, and
   * one another run or executor claimed since is left to it.
   */
  def refresh(storeDir: Path, hadoopConf: Configuration, lastRefreshMs: Long, keepAliveOnly: Boolean = false): Long = {
    val now = System.currentTimeMillis()
    if (now - lastRefreshMs < RefreshEveryMs) return lastRefreshMs
    val p = path(storeDir)
    try {
      val holder = self(hadoopConf, now)
      if (keepAliveOnly && !read(p, hadoopConf).exists(sameHolder(_, holder))) return lastRefreshMs
      val out = p.getFileSystem(hadoopConf).create(p, true)
      try out.write(Serialization.write(holder).getBytes(UTF_8)) finally out.close()
      held.put(p, hadoopConf -> holder)
      now
    } catch {
      case NonFatal(e) => // a lease is advice for operators, not state
        logWarning(s"Could not write the lease $p (it tells keyedstate rescale the query runs): ${e.getMessage}")
        lastRefreshMs
    }
  }

  /**
   * Removes the lease if it is still this provider's (of the query run `hadoopConf` names, on this
   * executor): a later run's or another executor's stays.
   */
  def release(storeDir: Path, hadoopConf: Configuration): Unit = {
    val p = path(storeDir)
    val me = self(hadoopConf, 0L)
    held.computeIfPresent(p, (_, entry) => if (sameHolder(entry._2, me)) null else entry)
    deleteIfHeldBy(p, hadoopConf, me)
  }

  private def deleteIfHeldBy(p: Path, c: Configuration, holder: LeaseHolder): Unit =
    if (read(p, c).exists(sameHolder(_, holder))) deleteQuietly(p, c)

  /**
   * Removes the leases query run `runId` holds under a checkpoint's `state` directory (every
   * partition of every operator, named stores included); leases of other runs stay. Returns how
   * many were removed.
   */
  def releaseRun(stateRoot: Path, runId: String, hadoopConf: Configuration): Int = {
    val fs = stateRoot.getFileSystem(hadoopConf)
    def dirs(p: Path): Seq[Path] =
      try fs.listStatus(p).toSeq.filter(_.isDirectory).map(_.getPath).filterNot(_.getName.startsWith("."))
      catch { case _: java.io.FileNotFoundException => Nil }
    // Store directories: state/<op>/<partition> and its named stores (not shared/, private/, ...).
    def numeric(p: Path) = p.getName.forall(_.isDigit)
    def stores(partition: Path) = dirs(partition).filterNot(d => StoreDirs(d.getName) || d.getName.startsWith("_"))
    val theirs = for {
      op <- dirs(stateRoot).filter(numeric)
      partition <- dirs(op).filter(numeric)
      dir <- partition +: stores(partition)
      lease = path(dir)
      if read(lease, hadoopConf).exists(_.queryRunId == runId)
    } yield lease
    theirs.foreach(deleteQuietly(_, hadoopConf))
    theirs.size
  }

  private val StoreDirs = Set("shared", "private", "changelog")

  /** The holder of a lease refreshed within [[StaleAfterMs]], if any, and its age. */
  def fresh(storeDir: Path, hadoopConf: Configuration): Option[(LeaseHolder, Long)] = {
    val p = path(storeDir)
    val fs = p.getFileSystem(hadoopConf)
    try {
      val in = fs.open(p)
      val holder = try Serialization.read[LeaseHolder](new String(in.readAllBytes(), UTF_8)) finally in.close()
      val age = System.currentTimeMillis() - math.max(holder.refreshedAtMs, fs.getFileStatus(p).getModificationTime)
      if (age < StaleAfterMs) Some(holder -> age) else None
    } catch {
      case _: java.io.FileNotFoundException => None
    }
  }

  private def deleteQuietly(p: Path, c: Configuration): Unit =
    try p.getFileSystem(c).delete(p, false)
    catch { case NonFatal(_) => () }
}
