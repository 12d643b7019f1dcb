package io.keyedstate.checkpoint.commit

import java.io.File

import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.{KeyedStateStoreProvider, ProviderSuiteHelpers, TestFileSystems}

/**
 * The commit path through the provider: changelog and snapshot checkpointing agree, snapshots
 * every `minDeltasForSnapshot` versions (at once for a bulk load), a late snapshot as the next
 * run's base, what each commit uploads and reports, changelog codecs, and manifests replaced in
 * place on an object store.
 */
class ProviderCommitSuite extends AnyFunSuite with ProviderSuiteHelpers {

  test("changelog and snapshot checkpointing give the same state at every version (random operations)") {
    val rnd = new scala.util.Random(42)
    val ops = (0 until 12).map { _ =>
      (0 until 300).map { _ =>
        (rnd.nextInt(10), s"k${rnd.nextInt(150)}", rnd.nextInt(1000).toLong)
      }
    }
    def runAll(changelog: Boolean): (File, Seq[Map[String, Any]]) = {
      val root = tempDir()
      val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "3",
        KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString)
      val p = newProvider(root, conf, useColumnFamilies = true)
      val states = ops.zipWithIndex.map { case (batch, v) =>
        val s = p.getStore(v.toLong)
        s.createColFamilyIfAbsent("multi", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
          useMultipleValuesPerKey = true)
        batch.foreach {
          case (op, k, x) if op < 5 => s.put(key(k), value(x))
          case (op, k, _) if op < 7 => s.remove(key(k))
          case (op, k, x) if op < 9 => s.merge(key(k), value(x), "multi")
          case (_, k, _) => s.remove(key(k), "multi")
        }
        if (v == 6) s.removeColFamilyIfExists("multi")
        val state = snapshotOf(s)
        s.commit()
        state
      }
      p.close()
      (root, states)
    }
    def snapshotOf(s: ReadStateStore): Map[String, Any] = {
      val multi =
        if (!s.allColumnFamilyNames.contains("multi")) Map.empty
        else {
          val it = s.iteratorWithMultiValues("multi")
          try it.map(pr => keyOf(pr.key)._1 -> pr.value.getLong(0)).toList.groupBy(_._1).map {
            case (k, vs) => k -> vs.map(_._2)
          } finally it.close()
        }
      Map("default" -> contents(s), "multi" -> multi)
    }
    val (snapRoot, viaSnapshots) = runAll(changelog = false)
    val (logRoot, viaChangelogs) = runAll(changelog = true)
    assert(viaChangelogs == viaSnapshots)
    // Every version also loads the same from the durable files alone.
    Seq(snapRoot -> false, logRoot -> true).foreach { case (root, changelog) =>
      val conf = storeConf(KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString)
      val fresh = newProvider(root, conf, useColumnFamilies = true)
      (1 to ops.size).foreach { v =>
        val s = fresh.getStore(v.toLong)
        s.createColFamilyIfAbsent("multi", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
          useMultipleValuesPerKey = true)
        val expected = viaSnapshots(v - 1)
        assert(contents(s) == expected("default"), s"version $v (changelog=$changelog)")
        s.abort()
      }
      fresh.close()
    }
  }

  test("a snapshot that finished after a run's last commit is the next run's base (chains stay short)") {
    val root = tempDir()
    val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0")
    // Six runs of one batch each (like availableNow jobs): no run commits after its snapshot.
    val replays = (0 until 6).map { v =>
      val p = newProvider(root, storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
        KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
      val s = p.getStore(v.toLong)
      val replayed = s.metrics.customMetrics.collectFirst {
        case (m, x) if m.name == "keyedstateLoadChangelogRecordsReplayed" => x
      }.get
      assert(contents(s).size == 100 * v)
      (0 until 100).foreach(i => s.put(key(s"v$v-$i"), value(i)))
      s.commit()
      p.awaitSnapshotUpload()
      p.doCleanupMaintenance()
      p.close()
      replayed
    }
    // Each load starts from the newest finished snapshot: at most 2 changelogs of 100 records.
    assert(replays.forall(_ <= 200), replays)
    val cleaner = newProvider(root, conf)
    cleaner.doCleanupMaintenance()
    cleaner.close()
    val store = new checkpoint.CheckpointStore(
      new org.apache.hadoop.fs.Path(partitionDir(root).getAbsolutePath), new org.apache.hadoop.conf.Configuration())
    val m6 = store.readManifest(6, None)
    val r = newProvider(root, storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    val s6 = r.getReadStore(6)
    assert(contents(s6).size == 600)
    s6.release(); r.close()
    assert(m6.changelogs.size <= 2, m6)
  }

  test("a bulk load is snapshotted at once: replaying it would cost more than loading the state") {
    val root = tempDir()
    val p = newProvider(root) // minDeltasForSnapshot: 10
    commitWith(p, 0) { s => (0 until 150000).foreach(i => s.put(key(s"k$i"), value(i))) }
    p.awaitSnapshotUpload()
    p.close()
    val fresh = newProvider(root, storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    val s = fresh.getStore(1)
    val m = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
    assert(m("keyedstateLoadChangelogRecordsReplayed") == 0, m)
    assert(s.metrics.numKeys == 150000)
    s.abort(); fresh.close()
  }

  test("changelog commits upload one small file; snapshots follow every minDeltasForSnapshot versions") {
    val root = tempDir()
    val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "3")
    val p = newProvider(root, conf)
    commitWith(p, 0) { s => (0 until 5000).foreach(i => s.put(key(s"k$i"), value(i))) }
    val metrics = (1 to 6).map { v =>
      val s = p.getStore(v.toLong)
      (0 until 10).foreach(i => s.put(key(s"k$i"), value(v)))
      s.commit()
      p.awaitSnapshotUpload()
      s.metrics.customMetrics.map { case (k, x) => k.name -> x }
    }
    metrics.foreach { m =>
      assert(m("keyedstateCommitFilesUploaded") == 1, m)
      assert(m("keyedstateCommitChangelogRecords") == 10, m)
      assert(m("keyedstateCommitBytesUploaded") < 2000, m)
    }
    // Snapshots are taken at versions 3 and 6; each one is the base of the next commit's manifest.
    val store = new checkpoint.CheckpointStore(
      new org.apache.hadoop.fs.Path(partitionDir(root).getAbsolutePath), new org.apache.hadoop.conf.Configuration())
    assert((1 to 7).map(v => store.readManifest(v, None).snapshotVersion) == Seq(0, 0, 0, 3, 3, 3, 6))
    assert(metrics(2)("keyedstateSnapshotBytesUploaded") > 0) // the commit of version 4
    p.close()
  }

  test("each changelog records its codec: stores written with one codec load and continue with another") {
    val root = tempDir()
    val codecs = Seq("zstd", "lz4", "none", "zstd")
    codecs.zipWithIndex.foreach { case (codec, v) =>
      // Each version on a new executor with another codec setting: it replays the others' changelogs.
      val p = newProvider(root, storeConf(KeyedStateConf.Prefix + "changelogCompression" -> codec,
        KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
      commitWith(p, v) { s => (0 until 50).foreach(i => s.put(key(s"k$i", v), value(i * 10 + v))) }
      p.close()
    }
    val logs = new File(partitionDir(root), "changelog").listFiles().filter(_.getName.endsWith(".changelog"))
      .sortBy(_.getName.takeWhile(_ != '-').toLong)
    assert(logs.map(f => java.nio.file.Files.readAllBytes(f.toPath)(5)).toSeq == Seq[Byte](2, 1, 0, 2))
    val p = newProvider(root, storeConf(KeyedStateConf.Prefix + "changelogCompression" -> "lz4",
      KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    val s = p.getReadStore(codecs.size.toLong)
    try assert(contents(s) == codecs.indices.flatMap(v => (0 until 50).map(i => (s"k$i", v) -> (i * 10L + v))).toMap)
    finally { s.release(); p.close() }
  }

  test("on an object store (abortable streams, no atomic rename) a rewritten manifest is replaced in place, never removed first") {
    val dir = tempDir()
    val hadoopConf = TestFileSystems.conf("objstore", classOf[ObjectStoreLikeFileSystem])
    def provider(): KeyedStateStoreProvider = {
      val p = new KeyedStateStoreProvider
      p.init(StateStoreId(s"objstore://${dir.getAbsolutePath}", 0, 0), keySchema, valueSchema,
        NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false, storeConf(), hadoopConf, false, None)
      p
    }
    ObjectStoreLikeFileSystem.reset()
    val first = provider()
    commitWith(first, 0)(_.put(key("a"), value(1)))
    first.close()
    // A second attempt at version 1 (a retried or speculative task) writes 1.manifest again.
    val second = provider()
    commitWith(second, 0)(_.put(key("a"), value(2)))
    second.close()
    assert(ObjectStoreLikeFileSystem.manifestRenamesOrDeletes.isEmpty, ObjectStoreLikeFileSystem.manifestRenamesOrDeletes)
    assert(ObjectStoreLikeFileSystem.manifestWrites.get() == 2)
    // A third attempt whose manifest write fails is aborted: the committed manifest stays.
    ObjectStoreLikeFileSystem.failManifestWrites = true
    val third = provider()
    val s = third.getStore(0)
    s.put(key("a"), value(3))
    val (condition, _) = sparkFailure(s.commit())
    assert(condition == "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT", condition)
    third.close()
    ObjectStoreLikeFileSystem.failManifestWrites = false
    val reader = provider()
    val r = reader.getReadStore(1)
    assert(contents(r) == Map(("a", 0) -> 2L))
    r.release(); reader.close()
  }

  test("snapshot commits upload only new files and report their phases") {
    val p = newProvider(tempDir(), snapshotMode)
    commitWith(p, 0) { s => (0 until 1000).foreach(i => s.put(key(s"k$i"), value(i))) }
    val s = p.getStore(1)
    s.put(key("one-more"), value(1))
    s.commit()
    val m = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
    assert(m("keyedstateCommitFilesReused") >= 1, m)
    assert(m("keyedstateCommitFilesUploaded") >= 1, m)
    assert(m("keyedstateCommitBytesUploaded") > 0, m)
    assert(KeyedStateMetricsNames.all.forall(m.contains), m)
    p.close()
  }
}

/**
 * A local file system that behaves like an object store for the files the provider replaces
 * (manifests and snapshot descriptors): it reports abortable output streams, a written file
 * appears whole when its stream closes and not at all when the stream is aborted. It records
 * every rename or delete of such a file (an object store's rename deletes the target first).
 */
class ObjectStoreLikeFileSystem extends org.apache.hadoop.fs.RawLocalFileSystem {
  import org.apache.hadoop.fs.{CommonPathCapabilities, FSDataOutputStream, Path}

  override def getUri: java.net.URI = java.net.URI.create("objstore:///")

  override def hasPathCapability(path: Path, capability: String): Boolean =
    capability == CommonPathCapabilities.ABORTABLE_STREAM || super.hasPathCapability(path, capability)

  private def replaced(path: Path): Boolean =
    path.getName.endsWith(".manifest") || path.getName.endsWith(".snapshot")

  override def rename(src: Path, dst: Path): Boolean = {
    if (replaced(dst)) ObjectStoreLikeFileSystem.manifestRenamesOrDeletes.add(s"rename $src $dst")
    super.rename(src, dst)
  }

  override def delete(path: Path, recursive: Boolean): Boolean = {
    if (replaced(path)) ObjectStoreLikeFileSystem.manifestRenamesOrDeletes.add(s"delete $path")
    super.delete(path, recursive)
  }

  override def create(path: Path, overwrite: Boolean, bufferSize: Int, replication: Short,
      blockSize: Long, progress: org.apache.hadoop.util.Progressable): FSDataOutputStream =
    if (!replaced(path)) super.create(path, overwrite, bufferSize, replication, blockSize, progress)
    else {
      ObjectStoreLikeFileSystem.manifestWrites.incrementAndGet()
      val target = pathToFile(path).toPath
      new FSDataOutputStream(new ObjectStoreLikeFileSystem.PublishOnClose(target), null)
    }
}

object ObjectStoreLikeFileSystem {
  val manifestRenamesOrDeletes = new java.util.concurrent.ConcurrentLinkedQueue[String]()
  val manifestWrites = new java.util.concurrent.atomic.AtomicInteger()
  @volatile var failManifestWrites = false

  def reset(): Unit = { manifestRenamesOrDeletes.clear(); manifestWrites.set(0); failManifestWrites = false }

  /** Buffers the object; `close` publishes it whole (an atomic move), `abort` drops it. */
  final class PublishOnClose(target: java.nio.file.Path)
      extends java.io.ByteArrayOutputStream with org.apache.hadoop.fs.Abortable {
    private var done = false
    override def write(b: Array[Byte], off: Int, len: Int): Unit = {
      if (failManifestWrites) throw new java.io.IOException(s"injected: the upload of $target failed")
      super.write(b, off, len)
    }
    override def close(): Unit = if (!done) {
      done = true
      val tmp = java.nio.file.Files.createTempFile(target.getParent, ".upload", ".tmp")
      java.nio.file.Files.write(tmp, toByteArray)
      java.nio.file.Files.move(tmp, target, java.nio.file.StandardCopyOption.ATOMIC_MOVE,
        java.nio.file.StandardCopyOption.REPLACE_EXISTING)
    }
    override def abort(): org.apache.hadoop.fs.Abortable.AbortableResult = {
      done = true
      new org.apache.hadoop.fs.Abortable.AbortableResult {
        override def alreadyClosed(): Boolean = false
        override def anyCleanupException(): java.io.IOException = null
      }
    }
  }
}

object KeyedStateMetricsNames {
  val all: Seq[String] = io.keyedstate.metrics.KeyedStateMetrics.all.map(_.name)
}
