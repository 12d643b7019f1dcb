package io.keyedstate.checkpoint

import java.io.{File, RandomAccessFile}
import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.Files
import java.util.UUID

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import io.keyedstate.checkpoint.commit.{Changelog, CommitStats, SnapshotStrategy, VersionLineage}
import io.keyedstate.checkpoint.restore.{LoadStats, RestoreOperation}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB

/**
 * The checkpoint layer on its own: a real RocksDB, committed through the commit layer
 * ([[VersionLineage]]) into a [[CheckpointStore]] on Hadoop's local file system, and read back
 * through [[RestoreOperation]]. No provider, no Spark rows: keys and values are strings.
 */
trait CheckpointLayerFixture {
  val Cf: String = LocalRocksDB.DefaultColumnFamily

  def tempDir(): File = {
    val d = Files.createTempDirectory("keyedstate-layer").toFile
    sys.addShutdownHook(LocalFiles.deleteRecursively(d))
    d
  }

  def layerConf(
      changelog: Boolean = true,
      retain: Int = 100,
      graceMs: Long = 0,
      checkpointIds: Boolean = false,
      verifyChecksums: Boolean = true): KeyedStateConf =
    KeyedStateConf.fromMap(Map(
      KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString,
      KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> graceMs.toString,
      KeyedStateConf.Prefix + "verifyChecksumsOnLoad" -> verifyChecksums.toString,
      KeyedStateConf.Prefix + "transferThreads" -> "2"), retain, checkpointIds)

  def storeAt(dir: File, hadoopConf: Configuration = new Configuration()): CheckpointStore =
    new CheckpointStore(new Path(dir.getAbsolutePath), hadoopConf)

  /** The expected state of a version, as the writer's model of it. */
  type State = Map[String, String]

  /**
   * One store partition's writer: a working RocksDB and the lineage its commits extend, as the
   * provider holds them, driven directly. `snapshotInterval` is minDeltasForSnapshot.
   */
  final class LayerWriter(val store: CheckpointStore, val conf: KeyedStateConf, snapshotInterval: Int = 3) {
    val work: File = tempDir()
    val cache: LocalFileCache = LocalFileCache.forStore(new File(work, "cache"), store.root.toString)
    val db: LocalRocksDB = LocalRocksDB.open(new File(work, "db"), conf)
    private val snapshotDir = new File(work, "snapshots")
    snapshotDir.mkdirs() // RocksDB checkpoints into it; the provider makes its work directory too
    val lineage = new VersionLineage(store, new SnapshotStrategy(store, snapshotDir, conf), cache,
      conf, snapshotInterval, 0L, None, 0L, Nil, Vector.empty)
    private var model: State = Map.empty
    private var history = Map[Long, State](0L -> Map.empty)
    store.ensureRoot()

    /** What the last commit did. */
    var lastStats: CommitStats = CommitStats()

    def state(version: Long): State = history(version)
    def version: Long = lineage.version

    /** Commits the next version with these writes; returns its manifest. */
    def commit(puts: State, deletes: Seq[String] = Nil, forceSnapshot: Boolean = false): VersionManifest = {
      val log =
        if (conf.changelogCheckpointing) Some(new Changelog.Writer(new File(work, s"log-${UUID.randomUUID()}")))
        else None
      puts.foreach { case (k, v) =>
        db.put(Cf, k.getBytes(UTF_8), v.getBytes(UTF_8))
        log.foreach(_.put(Cf, k.getBytes(UTF_8), v.getBytes(UTF_8)))
      }
      deletes.foreach { k =>
        db.delete(Cf, k.getBytes(UTF_8))
        log.foreach(_.delete(Cf, k.getBytes(UTF_8)))
      }
      model = model ++ puts -- deletes
      val next = lineage.version + 1
      val cfs = Seq(ManifestColumnFamily(Cf, model.size, "", "", "", multipleValues = false, internal = false))
      val (manifest, stats) =
        lineage.commit(db, log, cfs, model.size.toLong, next, UUID.randomUUID().toString, forceSnapshot)
      history += next -> model
      lastStats = stats
      manifest
    }

    /** Commits `versions` versions of 20 fresh keys each, rewriting and deleting a few older ones. */
    def commitSome(versions: Int): Unit = (1 to versions).foreach { _ =>
      val v = lineage.version + 1
      val puts = (0 until 20).map(i => s"v$v-k$i" -> s"value $v/$i").toMap ++
        (if (v > 1) Map(s"v${v - 1}-k0" -> s"rewritten at $v") else Map.empty)
      commit(puts, deletes = if (v > 2) Seq(s"v${v - 2}-k1") else Nil)
      lineage.awaitPendingSnapshot()
    }

    def close(): Unit = {
      scala.concurrent.Await.ready(lineage.close(), scala.concurrent.duration.Duration.Inf)
      db.close()
    }
  }

  /** Everything in a column family of a RocksDB, as strings. */
  def dbState(db: LocalRocksDB, cf: String = LocalRocksDB.DefaultColumnFamily): State = {
    val it = db.scan(cf, None, None)
    try it.map { case (k, v) => new String(k, UTF_8) -> new String(v, UTF_8) }.toMap finally it.close()
  }

  /**
   * Restores `version` as a new executor would (its own local cache unless one is given) and
   * returns the state and what the load did.
   */
  def restore(
      store: CheckpointStore,
      conf: KeyedStateConf,
      version: Long,
      cache: Option[LocalFileCache] = None): (State, LoadStats, VersionManifest) = {
    val work = tempDir()
    val c = cache.getOrElse(LocalFileCache.forStore(new File(work, "cache"), store.root.toString))
    val restores = new RestoreOperation(store, c, conf)
    val manifest = restores.latestBase(store.readManifest(version, None))
    val (db, stats) = restores.rebuild(manifest, new File(work, "db"), work, s"test store $version")
    try (dbState(db), stats, manifest) finally { db.close(); LocalFiles.deleteRecursively(work) }
  }

  def fileOf(store: CheckpointStore, entry: ManifestFile): File = new File(store.resolve(entry.path).toUri.getPath)

  def truncate(f: File, length: Long): Unit = {
    val raf = new RandomAccessFile(f, "rw")
    try raf.setLength(length) finally raf.close()
  }

  def flipByte(f: File, at: Long): Unit = {
    val raf = new RandomAccessFile(f, "rw")
    try { raf.seek(at); val b = raf.read(); raf.seek(at); raf.write(b ^ 0xff) } finally raf.close()
  }

  /** The message of `e` and of every cause, joined: where a test looks for path and version. */
  def messages(e: Throwable): String =
    Iterator.iterate(e)(_.getCause).takeWhile(_ != null).map(t => String.valueOf(t.getMessage)).mkString(" <- ")
}
