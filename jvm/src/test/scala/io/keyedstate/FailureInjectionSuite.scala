package io.keyedstate

import java.io.{File, IOException}
import java.net.URI
import java.util.concurrent.atomic.AtomicLong

import scala.collection.mutable
import scala.util.{Failure, Success, Try}

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf

/**
 * Failure injection at every file-system call of a commit and of retention, in-process (as
 * Spark's FailureInjectionCheckpointFileManager suite does): the provider's checkpoint lives on
 * `faulty://`, a local file system that throws on its Nth call of create, open, rename, delete,
 * mkdirs or listStatus. For every N up to the number of calls the step makes:
 *   - the step either takes effect fully or not at all: every version loads on a fresh provider
 *     (a new executor) with exactly the content written, or is absent;
 *   - the next attempt, without faults, succeeds;
 *   - retention never deletes a file a retained version needs.
 */
class FailureInjectionSuite extends AnyFunSuite with ProviderFixture {

  private def faultyConf(): Configuration = TestFileSystems.conf("faulty", classOf[FaultyFileSystem])

  private def provider(root: File, changelog: Boolean, local: File): KeyedStateStoreProvider = {
    val p = new KeyedStateStoreProvider
    val conf = storeConf(
      KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString,
      KeyedStateConf.Prefix + "localDir" -> local.getAbsolutePath,
      KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0",
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      "spark.sql.streaming.minBatchesToRetain" -> "2")
    p.init(StateStoreId(s"faulty://${root.getAbsolutePath}", 0, 0), keySchema, valueSchema,
      NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false, conf, faultyConf(), false, None)
    p
  }

  /** Version v holds keys k0..k(10v-1) with value v (earlier keys rewritten each version). */
  private def expected(v: Long): Map[(String, Int), Long] = (0 until (10 * v).toInt).map(i => (s"k$i", 0) -> v).toMap

  private def write(p: KeyedStateStoreProvider, v: Long): Long = {
    val s = p.getStore(v - 1)
    try {
      expected(v).keys.foreach { case (k, _) => s.put(key(k), value(v)) }
      s.commit()
    } catch {
      case e: Throwable => if (!s.hasCommitted) s.abort(); throw e
    }
  }

  /** Every version is either absent or exactly what was written, seen from a new executor. */
  private def checkVersions(root: File, changelog: Boolean, upTo: Long, mustExist: Set[Long], what: String): Unit = {
    FaultyFileSystem.disarm()
    val p = provider(root, changelog, tempDir())
    try (1L to upTo).foreach { v =>
      val loaded =
        try { val r = p.getReadStore(v); try Some(contents(r)) finally r.release() }
        catch { case _: Exception if !mustExist(v) => None }
      loaded.foreach(c => assert(c == expected(v), s"$what: version $v has other content"))
    } finally p.close()
  }

  /**
   * Runs `step` once per file-system call it makes, failing that call: `prepare` builds a fresh
   * checkpoint, `step` runs with the fault armed, `verify` (faults off) checks the outcome, given
   * the failed call and whether `step` reported success. Returns the failed calls, one per run.
   */
  private def atEveryCall(changelog: Boolean)(prepare: KeyedStateStoreProvider => Unit)(
      step: KeyedStateStoreProvider => Unit)(verify: (File, KeyedStateStoreProvider, String, Boolean) => Unit): Seq[String] = {
    // A run without faults counts the step's calls: every one of them must be tried below.
    val points = {
      val p = provider(tempDir(), changelog, tempDir())
      try {
        prepare(p)
        p.awaitSnapshotUpload()
        FaultyFileSystem.countOnly()
        step(p)
        p.awaitSnapshotUpload()
        FaultyFileSystem.disarm()
      } finally { FaultyFileSystem.disarm(); p.close() }
    }
    val failedCalls = mutable.ArrayBuffer.empty[String]
    var n = 1
    var everyCallTried = false
    while (!everyCallTried) {
      val root = tempDir()
      val p = provider(root, changelog, tempDir())
      try {
        prepare(p)
        p.awaitSnapshotUpload()
        FaultyFileSystem.armAt(n)
        val succeeded = Try(step(p)).isSuccess
        p.awaitSnapshotUpload()
        val call = FaultyFileSystem.failedCall
        FaultyFileSystem.disarm()
        call match {
          case None => everyCallTried = true // the step made fewer than n calls
          case Some(c) => failedCalls += c; verify(root, p, c, succeeded)
        }
      } finally { FaultyFileSystem.disarm(); p.close() }
      n += 1
    }
    // The loop ends only at the first n no call of the run reached, so every call of the runs
    // was tried. How many calls a run makes can differ from the fault-free count by timing (which
    // background snapshot uploads retention finds finished), so that count is reported only.
    assert(failedCalls.nonEmpty, s"no point tried; the fault-free run makes $points calls")
    info(s"${failedCalls.size} points tried; the fault-free run made $points calls")
    failedCalls.toSeq
  }

  private def summary(calls: Seq[String]): String = FaultyFileSystem.summary(calls)

  for (changelog <- Seq(false, true)) {
    test(s"a fault at any file-system call of a commit: the version is whole or absent, the retry commits (changelog=$changelog)") {
      val calls = atEveryCall(changelog)(p => (1L to 3L).foreach(v => write(p, v)))(p => write(p, 4)) {
        (root, p, call, committed) =>
        // A commit that reported success is durable; one that failed left version 4 whole or absent.
        checkVersions(root, changelog, 4, Set(1L, 2L, 3L) ++ (if (committed) Set(4L) else Set.empty), s"fault at $call")
        if (!committed) assert(write(p, 4) == 4, s"retry after a fault at $call")
        p.awaitSnapshotUpload()
        checkVersions(root, changelog, 4, Set(1L, 2L, 3L, 4L), s"after the retry of a fault at $call")
      }
      assert(calls.nonEmpty)
      info(summary(calls))
    }

    test(s"a fault at any file-system call of retention never deletes what a retained version needs (changelog=$changelog)") {
      val calls = atEveryCall(changelog)(p => (1L to 6L).foreach(v => write(p, v)))(_.doMaintenance()) { (root, p, call, _) =>
        // minBatchesToRetain = 2: versions 5 and 6 must load; the next version commits.
        checkVersions(root, changelog, 6, Set(5L, 6L), s"retention fault at $call")
        assert(write(p, 7) == 7)
        p.doMaintenance()
        checkVersions(root, changelog, 7, Set(6L, 7L), s"retention after a fault at $call")
      }
      assert(calls.nonEmpty)
      info(summary(calls))
    }

    for (warm <- Seq(false, true)) {
      val cache = if (warm) "the executor's local cache" else "a new executor"
      test(s"a fault at any file-system call of a load: a clear error or exactly the version, never other state ($cache, changelog=$changelog)") {
        val root = tempDir()
        val writerLocal = tempDir()
        val w = provider(root, changelog, writerLocal)
        try { (1L to 5L).foreach(v => write(w, v)); w.awaitSnapshotUpload() } finally w.close()
        def reader(): KeyedStateStoreProvider = provider(root, changelog, if (warm) writerLocal else tempDir())
        /** Loads version 5 for writing (as a task does: the lease too) and reads it whole. */
        def load(p: KeyedStateStoreProvider): Map[(String, Int), Long] = {
          val s = p.getStore(5)
          try contents(s) finally s.abort()
        }
        val points = {
          val p = reader()
          try { FaultyFileSystem.countOnly(); load(p); FaultyFileSystem.disarm() } finally { FaultyFileSystem.disarm(); p.close() }
        }
        val tried = (1 to points.toInt).map { n =>
          val p = reader()
          try {
            FaultyFileSystem.armAt(n)
            val outcome = Try(load(p))
            val call = FaultyFileSystem.failedCall.getOrElse(fail(s"call $n of $points was not made"))
            FaultyFileSystem.disarm()
            outcome match {
              case Success(state) => assert(state == expected(5), s"fault at $call: a load returned other state")
              case Failure(e) =>
                val condition = e match {
                  case se: org.apache.spark.SparkThrowable => se.getCondition
                  case other => fail(s"fault at $call: not a Spark error", other)
                }
                assert(condition.startsWith("CANNOT_LOAD_STATE_STORE."), s"fault at $call: $condition")
                val chain = Iterator.iterate[Throwable](e)(_.getCause).takeWhile(_ != null).map(_.getMessage).mkString(" <- ")
                assert(chain.contains("version 5") && chain.contains("injected fault"), s"fault at $call: $chain")
            }
            // The same executor loads it on the next attempt; the checkpoint is unharmed.
            assert(load(p) == expected(5), s"retry after a fault at $call")
            call
          } finally { FaultyFileSystem.disarm(); p.close() }
        }
        checkVersions(root, changelog, 5, Set(1L, 2L, 3L, 4L, 5L), "after every load fault")
        assert(tried.size == points && points > 0)
        info(summary(tried))
      }
    }
  }
}

/** The armed fault, shared by every instance (Hadoop creates file systems reflectively). */
object FaultyFileSystem {
  private val calls = new AtomicLong(0)
  @volatile private var failAt = 0L
  @volatile private var failed: Option[String] = None
  @volatile private var unchecked = false
  // Where each call counted by `countOnly` came from (see `site`).
  private val counted = new java.util.concurrent.ConcurrentLinkedQueue[String]()

  /**
   * Fails the `n`th call from now: with an IOException naming the path, or `unchecked`, as an
   * object store's client may, with an UncheckedIOException that names nothing.
   */
  def armAt(n: Int, unchecked: Boolean = false): Unit = synchronized {
    calls.set(0); failed = None; failAt = n; this.unchecked = unchecked
  }
  /** Counts calls without failing any: how many points a step has (then `disarm` returns it). */
  def countOnly(): Unit = synchronized { calls.set(0); failed = None; failAt = Long.MaxValue; counted.clear() }
  /** Stops injecting; returns the number of calls made since the last `armAt` or `countOnly`. */
  def disarm(): Long = synchronized { failAt = 0; calls.get }
  def failedCall: Option[String] = failed

  /** The site of each call the last `countOnly` counted, in call order. */
  def countedSites: Seq[String] = { import scala.jdk.CollectionConverters._; counted.asScala.toSeq }

  /**
   * The calls (1-based) to fail to reach every site: the first and the last call of each. A
   * site's calls differ only by path (one per partition or file), so the first meets nothing
   * written yet and the last everything else done.
   */
  def firstAndLastOfEachSite(sites: Seq[String]): Seq[Int] =
    sites.zipWithIndex.groupBy(_._1).values.flatMap(at => Seq(at.head._2, at.last._2)).toSeq.distinct.sorted.map(_ + 1)

  // A call's site: the operation and keyedstate's frames above it (the same code path, whatever
  // the path it names).
  private def site(what: String): String =
    Thread.currentThread().getStackTrace.iterator
      .filter(f => f.getClassName.startsWith("io.keyedstate.") && !f.getClassName.contains("Faulty") &&
        !f.getClassName.contains("InterceptedFileSystem"))
      .map(f => s"${f.getClassName}.${f.getMethodName}:${f.getLineNumber}")
      .mkString(s"$what@", "<", "")

  /** "N injection points: create a, open b, ..." for a run's failed calls. */
  def summary(calls: Seq[String]): String =
    s"${calls.size} injection points: " +
      calls.groupBy(_.takeWhile(_ != ' ')).toSeq.sortBy(_._1).map { case (k, v) => s"$k ${v.size}" }.mkString(", ")

  def call(what: String, path: Path): Unit = {
    if (failAt == Long.MaxValue) counted.add(site(what))
    if (failAt > 0 && calls.incrementAndGet() == failAt) {
      // Only the Nth call: calls made after it (cleanup, the retry) go through.
      failed = Some(s"$what ${path.getName}")
      if (unchecked) throw new java.io.UncheckedIOException(new IOException("injected fault: connection closed"))
      throw new IOException(s"injected fault: $what $path")
    }
  }
}

/** A local file system on `faulty://` whose calls fail when [[FaultyFileSystem]] says so. */
class FaultyFileSystem extends InterceptedFileSystem("faulty") {
  override protected def before(what: String, path: Path): Unit = FaultyFileSystem.call(what, path)
}

/**
 * [[FaultyFileSystem]] behind Hadoop's checksummed local file system, as `file://` is: `.crc`
 * side files kept with every file written or renamed (Spark reads its logs back through them).
 * Its calls reach the faulty one, so they are counted and failed the same way.
 */
class FaultyLocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem(new FaultyFileSystem)

/** [[FaultyLocalFileSystem]] for FileContext (`fs.AbstractFileSystem.faulty.impl`), as `LocalFs` is for `file://`. */
class FaultyFs(uri: URI, conf: Configuration)
    extends org.apache.hadoop.fs.DelegateToFileSystem(uri, new FaultyLocalFileSystem, conf, "faulty", false)
