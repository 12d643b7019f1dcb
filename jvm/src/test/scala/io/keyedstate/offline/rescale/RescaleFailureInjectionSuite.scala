package io.keyedstate.offline.rescale

import java.io.File
import java.nio.file.{Files, StandardCopyOption}
import java.security.MessageDigest

import scala.jdk.CollectionConverters._
import scala.util.Try

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{Encoders, SparkSession}
import org.apache.spark.sql.execution.streaming.runtime.MemoryStream
import org.apache.spark.sql.execution.streaming.state.StateStore
import org.apache.spark.sql.functions.col
import org.apache.spark.sql.streaming.OutputMode
import org.scalatest.BeforeAndAfterAll
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.{RescaleJournal, StoreLease}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.offline.{OfflineJob, QueryCheckpoint, StoreRef, StoreVersions}
import io.keyedstate.offline.rescale.Rescaler
import io.keyedstate.rocks.KeyGroups
import io.keyedstate.FaultyFileSystem
import io.keyedstate.FaultyFs
import io.keyedstate.FaultyLocalFileSystem
import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.ProviderFixture
import io.keyedstate.TestScale

/**
 * Failure injection in a rescale, at every file-system call (in CI the first and last call of
 * each call site; see [[io.keyedstate.TestScale]]) (the split and build tasks, the
 * journal, the publish), on a real streaming query's checkpoint: Spark local mode, the checkpoint
 * read and written through `faulty://` (Hadoop's checksummed local file system over
 * [[FaultyFileSystem]]). After a fault at call N:
 *   - the source checkpoint is usable: untouched (to a new checkpoint), or in place either
 *     exactly as before or held by the journal (the provider refuses it, naming the journal);
 *   - a run that reported success left a complete target;
 *   - the next run with the same arguments completes it: every key of the source, each in the
 *     partition Spark's hash partitioning gives it under the new count, and the count pinned.
 */
class RescaleFailureInjectionSuite extends AnyFunSuite with BeforeAndAfterAll with ProviderFixture {

  private var spark: SparkSession = _
  private var template: File = _
  private val From = 2
  // The journal is replaced through FileContext, which needs the scheme's AbstractFileSystem too.
  private val Faulty = Map("fs.faulty.impl" -> classOf[FaultyLocalFileSystem].getName, "fs.faulty.impl.disable.cache" -> "true",
    "fs.AbstractFileSystem.faulty.impl" -> classOf[FaultyFs].getName)

  override def beforeAll(): Unit = {
    val builder = SparkSession.builder()
      .master("local[1]")
      .appName("keyedstate-rescale-faults")
      .config("spark.ui.enabled", "false")
      .config("spark.sql.shuffle.partitions", From.toString)
      .config("spark.sql.streaming.stateStore.providerClass", classOf[KeyedStateStoreProvider].getName)
      .config(KeyedStateConf.Prefix + "localDir", tempDir().getAbsolutePath)
    spark = Faulty.foldLeft(builder) { case (b, (k, v)) => b.config(k, v).config(s"spark.hadoop.$k", v) }.getOrCreate()
    template = new File(tempDir(), "checkpoint")
    val input = MemoryStream[Int](Encoders.scalaInt, spark.sqlContext)
    val query = input.toDF().groupBy((col("value") % 37).as("k")).count()
      .writeStream.outputMode(OutputMode.Update()).format("noop")
      .option("checkpointLocation", template.getAbsolutePath).start()
    try (0 until 3).foreach { b => input.addData(b * 100 until b * 100 + 60); query.processAllAvailable() }
    finally query.stop()
    // Unload the providers: their leases go, and nothing touches the template any more.
    StateStore.stop()
  }

  override def afterAll(): Unit = if (spark != null) spark.stop()

  private val localConf = new Configuration()
  private val StateVersion = 3L // batches 0, 1, 2 committed

  private def copyOfTemplate(): File = {
    val dir = new File(tempDir(), "checkpoint")
    val base = template.toPath
    Files.walk(base).iterator().asScala.foreach { p =>
      val target = dir.toPath.resolve(base.relativize(p).toString)
      if (Files.isDirectory(p)) Files.createDirectories(target)
      else if (!p.getFileName.toString.contains(StoreLease.FileName)) Files.copy(p, target, StandardCopyOption.COPY_ATTRIBUTES)
    }
    dir
  }

  /** Every file under `dir` with a digest of its bytes: a checkpoint's exact content. */
  private def digest(dir: File): Map[String, String] =
    Files.walk(dir.toPath).iterator().asScala.filter(Files.isRegularFile(_)).map { p =>
      dir.toPath.relativize(p).toString ->
        MessageDigest.getInstance("SHA-256").digest(Files.readAllBytes(p)).map(b => f"$b%02x").mkString
    }.toMap

  private type Entries = Set[(String, String, String, Int)]

  /** The raw entries (column family, key, value, key-group tag) of each partition's store at the rescaled version. */
  private def stateOf(dir: File): Map[Int, Entries] = {
    val settings = OfflineJob.hadoopSettings(localConf)
    val ckpt = QueryCheckpoint.at(dir.getAbsolutePath, localConf)
    val conf = KeyedStateConf.fromMap(Map(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    val hex = (b: Array[Byte]) => b.map(x => f"$x%02x").mkString
    (for (op <- ckpt.operators; p <- ckpt.partitions(op); store <- ckpt.storeNames(op, p)) yield {
      val ref = StoreRef(op, store, p)
      val entries = StoreVersions.open(ref, ckpt.storeDir(ref).toString, StateVersion, settings, conf) {
        (_, manifest, db, _) =>
          manifest.columnFamilies.filter(cf => db.hasColumnFamily(cf.name)).flatMap { cf =>
            val tagOf = StoreVersions.tagReader(ref, cf, StateVersion)
            val it = db.scan(cf.name, None, None)
            try it.map { case (k, v) => (s"$op/$store/${cf.name}", hex(k), hex(v), tagOf(k)) }.toSeq finally it.close()
          }.toSet
      }
      p -> entries
    }).groupBy(_._1).map { case (p, es) => p -> es.flatMap(_._2).toSet }
  }

  private lazy val original: Map[Int, Entries] = stateOf(template)

  private def pinned(dir: File): Int = {
    val ckpt = QueryCheckpoint.at(dir.getAbsolutePath, localConf)
    ckpt.pinnedConf(ckpt.lastBatch("offsets").get)(QueryCheckpoint.PartitionsKey).toInt
  }

  /** A complete rescale to `to` partitions: the source's entries, each where Spark's partitioning puts it. */
  private def assertRescaled(dir: File, to: Int, what: String): Unit = {
    val state = stateOf(dir)
    assert(state.keySet == (0 until to).toSet, s"$what: partitions ${state.keySet}")
    state.foreach { case (p, entries) =>
      entries.foreach { case (_, _, _, tag) =>
        assert(KeyGroups.owner(tag, to) == p, s"$what: a key of partition ${KeyGroups.owner(tag, to)} is in $p")
      }
    }
    val all = state.values.toSeq.flatten
    assert(all.size == original.values.map(_.size).sum && all.toSet == original.values.flatten.toSet,
      s"$what: the rescaled state is not the source's")
    assert(pinned(dir) == to, s"$what: the offset log pins ${pinned(dir)} partitions")
    assert(!new File(dir, RescaleJournal.Dir).exists(), s"$what: the journal is left")
    RescaleJournal.checkNoRescaleInProgress(new Path(dir.getAbsolutePath), localConf)
  }

  private def rescale(source: File, to: Int, output: Option[File], inPlace: Boolean): Unit =
    new Rescaler(spark, _ => ()).run(s"faulty://${source.getAbsolutePath}", to,
      output.map(o => s"faulty://${o.getAbsolutePath}"), inPlace)

  /**
   * Runs `attempt` once per file-system call it makes, failing that call (under `make soak`; in
   * CI the first and the last call of each call site); returns the calls failed.
   */
  private def atEveryCall(attempt: () => (File, Option[File]), run: (File, Option[File]) => Unit)(
      verify: (File, Option[File], String, Boolean) => Unit): Seq[String] = {
    val (points, sites) = {
      val (src, out) = attempt()
      FaultyFileSystem.countOnly()
      try run(src, out) finally FaultyFileSystem.disarm()
      (FaultyFileSystem.disarm(), FaultyFileSystem.countedSites)
    }
    assert(sites.size == points, s"${sites.size} sites for $points calls")
    val chosen = TestScale(ci = FaultyFileSystem.firstAndLastOfEachSite(sites), full = 1 to points.toInt)
    info(s"failing ${chosen.size} of $points calls (${sites.distinct.size} call sites)")
    val tried = chosen.map { n =>
      val (src, out) = attempt()
      FaultyFileSystem.armAt(n)
      val ok = try Try(run(src, out)).isSuccess finally FaultyFileSystem.disarm()
      val call = FaultyFileSystem.failedCall.getOrElse(fail(s"call $n of $points was not made"))
      verify(src, out, call, ok)
      call
    }
    assert(tried.size == chosen.size && points > 0)
    tried
  }

  test("a fault at any file-system call of a rescale to a new checkpoint: the source untouched, the next run completes") {
    assert(original.keySet == (0 until From).toSet && original.values.forall(_.nonEmpty))
    val before = digest(copyOfTemplate())
    val to = 3
    val calls = atEveryCall(() => (copyOfTemplate(), Some(new File(tempDir(), "rescaled"))),
      (src, out) => rescale(src, to, out, inPlace = false)) { (src, out, call, ok) =>
      val dst = out.get
      assert(digest(src) == before, s"fault at $call: the source changed")
      if (ok) assertRescaled(dst, to, s"fault at $call, reported success")
      else {
        // Whatever is left must not be taken for a checkpoint: the journal holds it, or no query
        // could start there (no offset log).
        if (new File(dst, "offsets").exists()) {
          val refused = intercept[IllegalStateException](
            RescaleJournal.checkNoRescaleInProgress(new Path(dst.getAbsolutePath), localConf))
          assert(refused.getMessage.contains("journal.json") && refused.getMessage.contains("run it again"))
        }
        rescale(src, to, out, inPlace = false)
        assertRescaled(dst, to, s"the run after a fault at $call")
        assert(digest(src) == before, s"the run after a fault at $call changed the source")
      }
    }
    info(s"rescale ${From}->$to to a new checkpoint: ${FaultyFileSystem.summary(calls)}")
  }

  test("a fault at any file-system call of a rescale in place: the checkpoint as before or held by the journal, the next run completes") {
    val to = 1
    val calls = atEveryCall(() => (copyOfTemplate(), None), (src, _) => rescale(src, to, None, inPlace = true)) {
      (src, _, call, ok) =>
        if (ok) assertRescaled(src, to, s"fault at $call, reported success")
        else {
          val journal = RescaleJournal.read(new Path(src.getAbsolutePath), localConf)
          if (journal.exists(_.phase == RescaleJournal.Publishing)) {
            // Half published: no query may run on it.
            val refused = intercept[IllegalStateException](
              RescaleJournal.checkNoRescaleInProgress(new Path(src.getAbsolutePath), localConf))
            assert(refused.getMessage.contains("run it again"), refused.getMessage)
          } else {
            // Not published: the query's state is exactly as before.
            assert(stateOf(src) == original, s"fault at $call: the unpublished rescale changed the state")
            assert(pinned(src) == From, s"fault at $call: the partition count changed")
            RescaleJournal.checkNoRescaleInProgress(new Path(src.getAbsolutePath), localConf)
          }
          rescale(src, to, None, inPlace = true)
          assertRescaled(src, to, s"the run after a fault at $call")
        }
    }
    info(s"rescale ${From}->$to in place: ${FaultyFileSystem.summary(calls)}")
  }

}
