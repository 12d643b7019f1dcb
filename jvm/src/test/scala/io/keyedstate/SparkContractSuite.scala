package io.keyedstate

import java.io.{File, IOException}
import java.util.UUID
import java.util.concurrent.{CountDownLatch, TimeUnit}

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileStatus, FSDataOutputStream, Path, RawLocalFileSystem}
import org.apache.hadoop.util.Progressable
import org.apache.spark.sql.{Encoders, SparkSession}
import org.apache.spark.sql.execution.streaming.runtime.MemoryStream
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.functions.col
import org.apache.spark.sql.streaming.{OutputMode, StreamingQueryProgress}
import org.scalatest.BeforeAndAfterAll
import org.scalatest.concurrent.Eventually._
import org.scalatest.funsuite.AnyFunSuite
import org.scalatest.time.SpanSugar._

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.metrics.KeyedStateMetrics
import io.keyedstate.shims.StoreApi

/**
 * The provider under Spark's own executor-side machinery, as Spark's `StateStoreSuite` drives its
 * providers: stores opened through `StateStore.get` (the object every stateful operator uses),
 * background maintenance run by Spark's maintenance thread pools, and the driver's state store
 * coordinator deciding which instances stay loaded.
 */
class SparkContractSuite extends AnyFunSuite with BeforeAndAfterAll with ProviderFixture {

  private var spark: SparkSession = _

  override def beforeAll(): Unit = {
    StateStore.stop()
    spark = SparkSession.builder()
      .master("local[2]")
      .appName("keyedstate-spark-contract")
      .config("spark.ui.enabled", "false")
      .config("spark.sql.shuffle.partitions", "2")
      .getOrCreate()
    // The streaming query manager starts the driver's state store coordinator, which Spark's
    // maintenance asks whether each loaded instance is still the active one.
    spark.streams
  }

  override def afterAll(): Unit = {
    StateStore.stop()
    if (spark != null) spark.stop()
  }

  private val provider = classOf[KeyedStateStoreProvider].getName

  test("store calls with arguments Spark's providers refuse fail with Spark's error classes, keyedstate's message as the cause") {
    val p = newProvider(tempDir(), useColumnFamilies = true)
    val s = p.getStore(0)
    val spec = NoPrefixKeyStateEncoderSpec(keySchema)
    s.createColFamilyIfAbsent("single", keySchema, valueSchema, spec)
    def refused(condition: String, ours: String)(call: => Any): Unit = {
      val e = intercept[Exception](call)
      val spark = e match {
        case t: org.apache.spark.SparkThrowable => t
        case other => fail(s"expected Spark's $condition, got $other")
      }
      assert(spark.getCondition == condition, e.getMessage)
      val cause = io.keyedstate.errors.KeyedStateError.find(e).getOrElse(fail(s"no keyedstate cause under $e"))
      assert(cause.errorId == "KEYEDSTATE_UNSUPPORTED_OPERATION")
      assert(cause.getMessage.contains(ours), cause.getMessage)
    }
    refused("STATE_STORE_UNSUPPORTED_OPERATION_ON_MISSING_COLUMN_FAMILY", "'nope' is not in this state store; it has: default, single")(
      s.get(key("a"), "nope"))
    refused("STATE_STORE_UNSUPPORTED_OPERATION_ON_MISSING_COLUMN_FAMILY", "Cannot put")(s.put(key("a"), value(1), "nope"))
    refused("STATE_STORE_UNSUPPORTED_OPERATION_ON_MISSING_COLUMN_FAMILY", "Cannot iterator")(s.iterator("nope"))
    for (name <- Seq("", " padded", "default")) {
      refused("STATE_STORE_CANNOT_USE_COLUMN_FAMILY_WITH_INVALID_NAME", "allowed is a non-empty name")(
        s.createColFamilyIfAbsent(name, keySchema, valueSchema, spec))
    }
    refused("STATE_STORE_CANNOT_USE_COLUMN_FAMILY_WITH_INVALID_NAME", "Cannot remove column family 'default'")(
      s.removeColFamilyIfExists("default"))
    refused("STATE_STORE_CANNOT_CREATE_COLUMN_FAMILY_WITH_RESERVED_CHARS", "reserved for internal")(
      s.createColFamilyIfAbsent("_mine", keySchema, valueSchema, spec))
    s.createColFamilyIfAbsent("_internal", keySchema, valueSchema, spec, isInternal = true)
    refused("STATE_STORE_UNSUPPORTED_OPERATION", "multiple values per key; 'single' has one")(
      s.merge(key("a"), value(1), "single"))
    refused("STATE_STORE_UNSUPPORTED_OPERATION", "prefix-key encoder")(s.prefixScan(key("a"), "single"))
    refused("STATE_STORE_UNSUPPORTED_OPERATION", "range-scan key encoder")(s.rangeScan(None, None, "single"))
    for (call <- Seq[() => Any](() => s.put(null, value(1), "single"), () => s.put(key("a"), null, "single"),
        () => s.get(null, "single"))) {
      val e = intercept[IllegalArgumentException](call())
      assert(e.getMessage.startsWith("[KEYEDSTATE_INVALID_STORE_ARGUMENT] Cannot "), e.getMessage)
    }
    // Nothing refused touched the store: it commits what was written before.
    s.put(key("kept"), value(7), "single")
    assert(s.commit() == 1)
    val r = p.getReadStore(1)
    assert(r.get(key("kept"), "single").getLong(0) == 7L)
    assert(r.allColumnFamilyNames == Set("default", "single", "_internal"))
    r.release(); p.close()

    val plain = newProvider(tempDir())
    val q = plain.getStore(0)
    refused("STATE_STORE_UNSUPPORTED_OPERATION", "useColumnFamilies=true")(
      q.createColFamilyIfAbsent("other", keySchema, valueSchema, spec))
    q.abort(); plain.close()
  }

  private def open(id: StateStoreProviderId, version: Long, conf: StateStoreConf, hadoopConf: Configuration): StateStore =
    StateStore.get(id, keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema), version, None, None,
      useColumnFamilies = false, conf, hadoopConf)

  /** Loads `version`, puts one key named after it and commits `version + 1`. */
  private def commitOneKey(
      id: StateStoreProviderId, version: Long, conf: StateStoreConf, hadoopConf: Configuration): Unit = {
    val s = open(id, version, conf, hadoopConf)
    s.put(key(s"k$version"), value(version))
    assert(s.commit() == version + 1)
  }

  private def manifestVersions(storeDir: File): Set[Long] =
    Option(storeDir.listFiles()).getOrElse(Array.empty[File]).map(_.getName)
      .filter(n => n.endsWith(".manifest") && !n.startsWith(".")).map(_.stripSuffix(".manifest").toLong).toSet

  /** Spark's maintenance every 100 ms (as Spark's own maintenance tests run it), 2 versions retained. */
  private def maintenanceConf(): StateStoreConf = storeConf(
    "spark.sql.streaming.stateStore.providerClass" -> provider,
    "spark.sql.streaming.stateStore.maintenanceInterval" -> "100ms",
    "spark.sql.streaming.minBatchesToRetain" -> "2",
    KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath)

  /** Two stores of one run: partition 0 on the local file system at `localRoot`, 1 at `otherRoot` on `scheme://`. */
  private def twoStores(localRoot: File, scheme: String, otherRoot: File): (StateStoreProviderId, StateStoreProviderId) = {
    val runId = UUID.randomUUID()
    (StateStoreProviderId(StateStoreId(localRoot.getAbsolutePath, 0, 0), runId),
      StateStoreProviderId(StateStoreId(s"$scheme://${otherRoot.getAbsolutePath}", 0, 1), runId))
  }

  test("a maintenance run that throws unloads only its own store; the others keep serving and cleaning up") {
    val healthyRoot = tempDir()
    val failingRoot = tempDir()
    val conf = maintenanceConf()
    val hadoopConf = TestFileSystems.conf(ListingFailsFileSystem.Scheme, classOf[ListingFailsFileSystem])
    ListingFailsFileSystem.failing = false

    // The other store's checkpoint is on a file system that can be told to fail every listing:
    // retention lists the store directory first, so its maintenance then throws.
    val (healthy, failing) = twoStores(healthyRoot, ListingFailsFileSystem.Scheme, failingRoot)

    def commit(id: StateStoreProviderId, version: Long): Unit = commitOneKey(id, version, conf, hadoopConf)
    (0L until 4L).foreach { v => commit(healthy, v); commit(failing, v) }
    assert(StateStore.isLoaded(healthy) && StateStore.isLoaded(failing))
    assert(StateStore.isMaintenanceRunning)

    try {
      ListingFailsFileSystem.failing = true
      eventually(timeout(30.seconds), interval(100.millis)) {
        assert(!StateStore.isLoaded(failing), "Spark's maintenance should have unloaded the store whose cleanup threw")
      }
      assert(ListingFailsFileSystem.listingsRefused.get() > 0)
      assert(StateStore.isLoaded(healthy), "a maintenance failure of another store unloaded this one")

      // The healthy store keeps serving its loaded version, and its retention keeps running.
      (4L until 8L).foreach(v => commit(healthy, v))
      eventually(timeout(30.seconds), interval(100.millis)) {
        assert(manifestVersions(partitionDir(healthyRoot, 0)) == Set(7L, 8L))
      }
      assert(StateStore.isLoaded(healthy))
      val s = open(healthy, 8, conf, hadoopConf)
      assert(contents(s) == (0L until 8L).map(v => (s"k$v", 0) -> v).toMap)
      s.abort()
      val m = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
      assert(m("keyedstateLoadMs") == 0 && m("keyedstateLoadBytesDownloaded") == 0,
        s"the healthy store was reloaded instead of served from its loaded instance: $m")
    } finally ListingFailsFileSystem.failing = false

    // The unloaded store lost nothing: a new instance loads its last version and goes on.
    assert(manifestVersions(partitionDir(failingRoot, 1)).contains(4L))
    val again = open(failing, 4, conf, hadoopConf)
    assert(contents(again) == (0L until 4L).map(v => (s"k$v", 0) -> v).toMap)
    again.put(key("k4"), value(4))
    assert(again.commit() == 5)
    assert(StateStore.isLoaded(failing) && StateStore.isLoaded(healthy))
    StateStore.stop()
  }

  test("a store whose commit hangs on its file system does not hold up the cleanup of the others") {
    val healthyRoot = tempDir()
    val stuckRoot = tempDir()
    val conf = maintenanceConf()
    val hadoopConf = TestFileSystems.conf(CommitHoldingFileSystem.Scheme, classOf[CommitHoldingFileSystem])
    CommitHoldingFileSystem.reset()

    val (healthy, stuck) = twoStores(healthyRoot, CommitHoldingFileSystem.Scheme, stuckRoot)
    def commit(id: StateStoreProviderId, version: Long): Unit = commitOneKey(id, version, conf, hadoopConf)
    (0L until 4L).foreach { v => commit(healthy, v); commit(stuck, v) }

    // The stuck store's next commit hangs in its changelog upload, holding the store.
    CommitHoldingFileSystem.armed = true
    val committer = new Thread(() => commit(stuck, 4), "stuck-commit")
    committer.start()
    try {
      assert(CommitHoldingFileSystem.held.await(30, TimeUnit.SECONDS), "the stuck commit never reached its upload")
      // Spark's maintenance keeps running over both stores; the healthy one's retention must go on.
      (4L until 8L).foreach(v => commit(healthy, v))
      eventually(timeout(30.seconds), interval(100.millis)) {
        assert(manifestVersions(partitionDir(healthyRoot, 0)) == Set(7L, 8L))
      }
      assert(committer.isAlive, "the stuck commit should still be held")
    } finally {
      CommitHoldingFileSystem.armed = false
      CommitHoldingFileSystem.release.countDown()
      committer.join(60000)
    }
    // Released, the stuck store's commit completes and its own cleanup resumes.
    assert(manifestVersions(partitionDir(stuckRoot, 1)).contains(5L))
    eventually(timeout(30.seconds), interval(100.millis)) {
      assert(manifestVersions(partitionDir(stuckRoot, 1)) == Set(4L, 5L))
    }
    assert(StateStore.isLoaded(healthy) && StateStore.isLoaded(stuck))
    StateStore.stop()
  }

  test("a commit Spark forces to snapshot reports it, and the instance metric gives the last uploaded snapshot") {
    val root = tempDir()
    val p = newProvider(root, storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "100"))
    def metricsOf(s: StateStore): (Map[String, Long], Map[StateStoreInstanceMetric, Long]) =
      (s.metrics.customMetrics.map { case (k, v) => k.name -> v }, s.metrics.instanceMetrics)
    val instance = StoreApi.SnapshotLastUploaded.withNewId(0, StateStoreId.DEFAULT_STORE_NAME)
    assert(p.supportedInstanceMetrics.map(_.metricPrefix) == Seq("SnapshotLastUploaded"))

    val s0 = p.getStore(0)
    s0.put(key("a"), value(1))
    s0.commit()
    val (m1, i1) = metricsOf(s0)
    assert(m1("keyedstateForceSnapshotCount") == 0 && i1 == Map(instance -> -1L), (m1, i1))
    assert(i1.keys.head.name == "SnapshotLastUploaded.partition_0_default")

    // What Spark does when its coordinator reports the store's snapshot uploads lagging.
    val s1 = p.getStore(1, None, forceSnapshotOnCommit = true, loadEmpty = false)
    s1.put(key("b"), value(2))
    s1.commit()
    assert(metricsOf(s1)._1("keyedstateForceSnapshotCount") == 1)
    p.awaitSnapshotUpload()
    assert(metricsOf(s1)._2 == Map(instance -> 2L))
    assert(partitionDir(root).listFiles().exists(_.getName.startsWith("2_")), "no snapshot of version 2")

    val s2 = p.getStore(2)
    s2.put(key("c"), value(3))
    s2.commit()
    val (m3, i3) = metricsOf(s2)
    assert(m3("keyedstateForceSnapshotCount") == 0 && i3 == Map(instance -> 2L), (m3, i3))
    p.close()
  }

  test("a streaming query's progress carries keyedstate's metrics and each partition's last uploaded snapshot") {
    val checkpoint = new File(tempDir(), "checkpoint").getAbsolutePath
    val settings = Map(
      "spark.sql.streaming.stateStore.providerClass" -> provider,
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      "spark.sql.shuffle.partitions" -> "2")
    settings.foreach { case (k, v) => spark.conf.set(k, v) }
    try {
      val input = MemoryStream[Int](Encoders.scalaInt, spark.sqlContext)
      def run(batches: Range): Seq[StreamingQueryProgress] = {
        val query = input.toDF().groupBy((col("value") % 10).as("key")).count()
          .writeStream.outputMode(OutputMode.Update()).format("noop")
          .option("checkpointLocation", checkpoint).start()
        try {
          batches.foreach { b => input.addData((0 until 20).map(_ + b): _*); query.processAllAvailable() }
          query.recentProgress.toSeq.filter(_.numInputRows > 0)
        } finally query.stop()
      }
      val first = run(0 until 8)
      assert(first.size == 8, first.map(_.batchId))
      val names = KeyedStateMetrics.all.map(_.name)
      val snapshotMetric = (0 until 2).map(p => s"SnapshotLastUploaded.partition_${p}_default")
      val uploaded = first.map { progress =>
        val op = progress.stateOperators.head
        val m = op.customMetrics.asScala.map { case (k, v) => k -> v.longValue }.toMap
        assert(names.forall(m.contains), s"missing: ${names.filterNot(m.contains)}")
        // Every batch updates the 10 keys: each update is one changelog record, uploaded.
        assert(op.numRowsTotal == 10 && op.numRowsUpdated == 10, op)
        assert(m("keyedstateCommitChangelogRecords") == op.numRowsUpdated, m)
        assert(m("keyedstateCommitFilesUploaded") >= 1 && m("keyedstateCommitBytesUploaded") > 0, m)
        assert(m("keyedstateForceSnapshotCount") >= 0 && m("keyedstateForceSnapshotCount") <= 2, m)
        assert(snapshotMetric.forall(m.contains), s"no instance metrics in $m")
        snapshotMetric.map(m)
      }
      // Per partition: -1 before the first snapshot, then the last version whose snapshot was
      // made durable (every 2 versions or so: an upload still running delays the next), never
      // going back, and a snapshot of that version is in the checkpoint.
      snapshotMetric.indices.foreach { p =>
        val values = uploaded.map(_(p))
        assert(values.head == -1L, values)
        assert(values.sliding(2).forall { case Seq(a, b) => a <= b; case _ => true }, values)
        assert(values.last >= 2, values)
        val descriptors = new File(checkpoint, s"state/0/$p").listFiles().map(_.getName).filter(_.endsWith(".snapshot"))
        assert(descriptors.exists(_.startsWith(s"${values.last}_")), s"$values, descriptors: ${descriptors.toSeq}")
      }
      // A restart loads the state (new provider instances, files from the local cache).
      val second = run(8 until 9)
      val m = second.head.stateOperators.head.customMetrics.asScala.map { case (k, v) => k -> v.longValue }.toMap
      assert(m("keyedstateLoadFilesReusedLocally") + m("keyedstateLoadBytesDownloaded") > 0, m)
      assert(second.head.stateOperators.head.numRowsTotal == 10)
    } finally settings.keys.foreach(spark.conf.unset)
  }
}

/** Hadoop's local file system whose listings fail while `failing` is set (a store's storage gone bad). */
class ListingFailsFileSystem extends RawLocalFileSystem {
  override def getUri: java.net.URI = java.net.URI.create(s"${ListingFailsFileSystem.Scheme}:///")

  override def listStatus(path: Path): Array[FileStatus] = {
    if (ListingFailsFileSystem.failing) {
      ListingFailsFileSystem.listingsRefused.incrementAndGet()
      throw new IOException(s"injected: cannot list $path")
    }
    super.listStatus(path)
  }
}

object ListingFailsFileSystem {
  val Scheme = "listingfails"
  @volatile var failing = false
  val listingsRefused = new java.util.concurrent.atomic.AtomicInteger()
}

/** Hadoop's local file system that holds changelog uploads while `armed`, until `release`. */
class CommitHoldingFileSystem extends RawLocalFileSystem {
  override def getUri: java.net.URI = java.net.URI.create(s"${CommitHoldingFileSystem.Scheme}:///")

  override def create(path: Path, overwrite: Boolean, bufferSize: Int, replication: Short, blockSize: Long,
      progress: Progressable): FSDataOutputStream = {
    if (CommitHoldingFileSystem.armed && path.getParent.getName == "changelog") {
      CommitHoldingFileSystem.held.countDown()
      CommitHoldingFileSystem.release.await(60, TimeUnit.SECONDS)
    }
    super.create(path, overwrite, bufferSize, replication, blockSize, progress)
  }
}

object CommitHoldingFileSystem {
  val Scheme = "holdcommits"
  @volatile var armed = false
  @volatile var held = new CountDownLatch(1)
  @volatile var release = new CountDownLatch(1)

  def reset(): Unit = { armed = false; held = new CountDownLatch(1); release = new CountDownLatch(1) }
}
