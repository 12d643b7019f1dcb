package io.keyedstate.offline

import java.util.concurrent.atomic.AtomicBoolean

import scala.jdk.CollectionConverters._
import scala.reflect.ClassTag
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.spark.{SparkContext, SparkStageInfo}
import org.apache.spark.sql.SparkSession

import io.keyedstate.conf.KeyedStateConf

/**
 * A phase of an offline operation on a checkpoint (a rescale's split or build, a savepoint's
 * copy) as one Spark job with one task per item, so it spreads over the session's executors;
 * reports progress every few seconds. When a task fails, the job's other tasks are cancelled and
 * waited for before the failure is thrown: they may still write files, and the caller's cleanup
 * of its output must come after them.
 */
object OfflineJob {
  /** How long a failed phase waits for its other tasks to stop before the output is cleaned up. */
  private val TaskStopWaitMs = 120000L

  def run[T: ClassTag, R: ClassTag](
      spark: SparkSession,
      operation: String,
      phase: String,
      tasks: Seq[T],
      hadoopSettings: Map[String, String],
      conf: KeyedStateConf,
      progress: String => Unit)(f: (T, Map[String, String], KeyedStateConf) => R): Seq[R] = {
    val sc = spark.sparkContext
    val group = s"keyedstate-$operation-$phase-${java.util.UUID.randomUUID()}"
    sc.setJobGroup(group, s"keyedstate $operation: $phase (${tasks.size} tasks)", interruptOnCancel = true)
    val done = new AtomicBoolean(false)
    val reporter = new Thread(() => {
      while (!done.get()) {
        Thread.sleep(2000)
        if (!done.get()) progress(s"$phase: ${completed(sc, group)}/${tasks.size} tasks done")
      }
    }, s"keyedstate-$operation-progress")
    reporter.setDaemon(true)
    reporter.start()
    try {
      val out = sc.parallelize(tasks, math.max(1, tasks.size)).map(t => f(t, hadoopSettings, conf)).collect().toSeq
      progress(s"$phase: ${tasks.size}/${tasks.size} tasks done")
      out
    } catch {
      case NonFatal(e) =>
        sc.cancelJobGroup(group)
        val deadline = System.currentTimeMillis() + TaskStopWaitMs
        while (running(sc, group) > 0 && System.currentTimeMillis() < deadline) Thread.sleep(50)
        throw e
    } finally {
      done.set(true)
      sc.clearJobGroup()
    }
  }

  private def completed(sc: SparkContext, group: String): Int = stagesOf(sc, group).map(_.numCompletedTasks()).sum

  private def running(sc: SparkContext, group: String): Int = stagesOf(sc, group).map(_.numActiveTasks()).sum

  private def stagesOf(sc: SparkContext, group: String): Iterator[SparkStageInfo] =
    sc.statusTracker.getJobIdsForGroup(group).iterator
      .flatMap(id => sc.statusTracker.getJobInfo(id))
      .flatMap(_.stageIds().iterator.flatMap(s => sc.statusTracker.getStageInfo(s)))

  /** A Hadoop configuration as the map a task carries (a `Configuration` is not serializable). */
  def hadoopSettings(c: Configuration): Map[String, String] =
    c.iterator().asScala.map(e => e.getKey -> e.getValue).toMap

  /** The Hadoop configuration of a task's settings. */
  def hadoopConf(settings: Map[String, String]): Configuration = {
    val c = new Configuration(false)
    settings.foreach { case (k, v) => c.set(k, v) }
    c
  }
}
