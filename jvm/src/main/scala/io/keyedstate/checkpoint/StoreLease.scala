package io.keyedstate.checkpoint

import java.nio.charset.StandardCharsets.UTF_8
import java.util.concurrent.ConcurrentHashMap

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.SparkEnv
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

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
object StoreLease {
  val FileName = ".keyedstate-lease"
  /** Three default maintenance intervals without a refresh: the holder is gone. */
  val StaleAfterMs: Long = 3 * 60 * 1000L
  private val RefreshEveryMs = 30 * 1000L

  private implicit val formats: Formats = DefaultFormats
  private val held = ConcurrentHashMap.newKeySet[(Path, Configuration)]()
  sys.addShutdownHook(held.forEach { case (p, c) => deleteQuietly(p, c) })

  def path(storeDir: Path): Path = new Path(storeDir, FileName)

  /**
   * Claims or refreshes the lease (skipped when refreshed recently); never fails the caller. With
   * `keepAliveOnly` (maintenance) a lease that is gone is not written again: the query stopped.
   */
  def refresh(storeDir: Path, hadoopConf: Configuration, lastRefreshMs: Long, keepAliveOnly: Boolean = false): Long = {
    val now = System.currentTimeMillis()
    if (now - lastRefreshMs < RefreshEveryMs) return lastRefreshMs
    val p = path(storeDir)
    try {
      if (keepAliveOnly && !p.getFileSystem(hadoopConf).exists(p)) {
        held.remove(p -> hadoopConf)
        return 0L
      }
      val env = Option(SparkEnv.get)
      val holder = LeaseHolder(
        env.map(_.conf.getAppId).getOrElse("unknown"),
        Option(hadoopConf.get(StreamExecution.RUN_ID_KEY)).getOrElse("unknown"),
        env.map(_.executorId).getOrElse("unknown"),
        java.net.InetAddress.getLocalHost.getHostName,
        now)
      val fs = p.getFileSystem(hadoopConf)
      val out = fs.create(p, true)
      try out.write(Serialization.write(holder).getBytes(UTF_8)) finally out.close()
      held.add(p -> hadoopConf)
      now
    } catch {
      case NonFatal(_) => lastRefreshMs // a lease is advice for operators, not state
    }
  }

  def release(storeDir: Path, hadoopConf: Configuration): Unit = {
    val p = path(storeDir)
    held.remove(p -> hadoopConf)
    deleteQuietly(p, hadoopConf)
  }

  /**
   * Removes the leases query run `runId` holds under a checkpoint's `state` directory (every
   * partition of every operator, named stores included); leases of other runs stay. Returns how
   * many were removed; never fails the caller (a lease is advice, and goes stale on its own).
   */
  def releaseRun(stateRoot: Path, runId: String, hadoopConf: Configuration): Int = {
    var released = 0
    try {
      val fs = stateRoot.getFileSystem(hadoopConf)
      def dirs(p: Path): Seq[Path] =
        try fs.listStatus(p).toSeq.filter(_.isDirectory).map(_.getPath).filterNot(_.getName.startsWith("."))
        catch { case _: java.io.FileNotFoundException => Nil }
      for (op <- dirs(stateRoot); partition <- dirs(op); dir <- partition +: dirs(partition)) {
        val p = path(dir)
        val holder =
          try {
            val in = fs.open(p)
            try Some(Serialization.read[LeaseHolder](new String(in.readAllBytes(), UTF_8))) finally in.close()
          } catch { case NonFatal(_) => None }
        if (holder.exists(_.queryRunId == runId)) {
          deleteQuietly(p, hadoopConf)
          released += 1
        }
      }
    } catch { case NonFatal(_) => () }
    released
  }

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
