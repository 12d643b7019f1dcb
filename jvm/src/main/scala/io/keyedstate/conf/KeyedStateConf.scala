package io.keyedstate.conf

import java.io.File
import java.util.Locale

import org.apache.spark.sql.execution.streaming.state.StateStoreConf

import io.keyedstate.errors.KeyedStateErrors

/**
 * The provider's options, read from the session under `spark.sql.streaming.stateStore.keyedstate.*`
 * (Spark hands every `spark.sql.streaming.stateStore.*` key to the provider through
 * [[StateStoreConf.sqlConfs]]). Each option is documented in `docs/configuration.md`.
 *
 * Parsing is strict: an unknown key or a value out of range fails the query at start with a
 * message naming the key, the value and what is allowed.
 */
final case class KeyedStateConf(
    localDir: Option[String],
    blockCacheSizeMB: Long,
    writeBufferSizeMB: Long,
    heapWriteBufferMB: Long,
    compression: String,
    trackNumKeys: Boolean,
    transferThreads: Int,
    verifyChecksumsOnLoad: Boolean,
    orphanFileGracePeriodMs: Long,
    maxOpenFiles: Int,
    changelogCheckpointing: Boolean,
    changelogCompression: String,
    acquireTimeoutMs: Long,
    // The `ttl.*` options (docs/ttl.md), resolved per operator and column family.
    ttl: TtlSettings,
    // `queryable.operator.<id>=<name>`: Spark's operators whose state lookups read (docs/queryable-state.md).
    queryableOperators: Map[Long, String],
    // From Spark's own StateStoreConf:
    minVersionsToRetain: Int,
    checkpointIdsEnabled: Boolean)

object KeyedStateConf {
  val Prefix = "spark.sql.streaming.stateStore.keyedstate."
  /** `<QueryablePrefix><operator id>=<name>`: Spark's operators whose state lookups read (`keyedstate.queryable`). */
  val QueryablePrefix: String = Prefix + "queryable.operator."

  /** The folder keyedstate creates in its local directory (`<localDir>/keyedstate/jvm-<uuid>`). */
  val LocalSubdir = "keyedstate"
  val LocalDirKey: String = Prefix + "localDir"

  /** The local directory keyedstate was given, for a file under it: the parent of its `keyedstate/` folder. */
  def localDirOf(file: java.io.File): java.io.File =
    Iterator.iterate(file.getAbsoluteFile)(_.getParentFile).takeWhile(_ != null)
      .find(f => f.getName == LocalSubdir && f.getParentFile != null)
      .map(_.getParentFile)
      .getOrElse(file.getAbsoluteFile.getParentFile)

  val Compressions: Seq[String] = Seq("none", "snappy", "lz4", "zstd")
  /** The codecs of changelog files (`checkpoint.commit.Changelog.Compression`). */
  val ChangelogCompressions: Seq[String] = Seq("none", "lz4", "zstd")

  /**
   * One option: its key, default, what is allowed and what it does. The Python keywords
   * (`python/keyedstate/_options.json`) and the table in `docs/configuration.md` are generated
   * from these ([[OptionDocs]]); `OptionDocsSuite` fails when they are stale.
   */
  sealed abstract class Opt[T](
      val name: String,
      val default: T,
      val allowed: String,
      val description: String) {
    def key: String = Prefix + name
    def parse(raw: String): Option[T]
    /** The Python keyword: the name in snake_case (`blockCacheSizeMB` -> `block_cache_size_mb`). */
    def pythonName: String = name.replaceAll("([a-z0-9])([A-Z])", "$1_$2").toLowerCase(Locale.ROOT)
    /** How the default reads in the docs. */
    def defaultText: String = default.toString
    /** The rule Python checks values with: kind, and its bounds or choices. */
    def rule: Map[String, Any]
  }
  private final class LongOpt(name: String, default: Long, min: Long, max: Long, description: String)
      extends Opt[Long](name, default,
        if (max == Long.MaxValue) s"an integer of at least $min" else s"an integer from $min to $max", description) {
    def parse(raw: String): Option[Long] =
      raw.trim.toLongOption.filter(v => v >= min && v <= max)
    def rule: Map[String, Any] = Map("kind" -> "integer", "min" -> min, "max" -> max)
  }
  private final class BoolOpt(name: String, default: Boolean, description: String)
      extends Opt[Boolean](name, default, "true or false", description) {
    def parse(raw: String): Option[Boolean] = raw.trim.toLowerCase(Locale.ROOT).toBooleanOption
    def rule: Map[String, Any] = Map("kind" -> "boolean")
  }
  private final class ChoiceOpt(name: String, default: String, choices: Seq[String], description: String)
      extends Opt[String](name, default, choices.mkString("one of ", ", ", ""), description) {
    def parse(raw: String): Option[String] =
      Some(raw.trim.toLowerCase(Locale.ROOT)).filter(choices.contains)
    def rule: Map[String, Any] = Map("kind" -> "choice", "choices" -> choices)
  }
  private final class PathOpt(name: String, defaultDescription: String, description: String)
      extends Opt[Option[String]](name, None, "an absolute local directory path", description) {
    def parse(raw: String): Option[Option[String]] =
      Some(raw.trim).filter(p => new File(p).isAbsolute).map(Some(_))
    override def defaultText: String = defaultDescription
    def rule: Map[String, Any] = Map("kind" -> "absolute_path")
  }

  private val LocalDir = new PathOpt("localDir",
    "Spark's local dir (`LOCAL_DIRS`, `SPARK_LOCAL_DIRS`, `spark.local.dir`), else `java.io.tmpdir`",
    "Where the working RocksDB instances and the local file cache live (under `keyedstate/`). Use a fast local disk.")
  private val BlockCacheSizeMB = new LongOpt("blockCacheSizeMB", 64, 1, 1L << 20,
    "RocksDB block cache, **shared by every partition on an executor** (sized by the first store opened in the JVM).")
  private val WriteBufferSizeMB = new LongOpt("writeBufferSizeMB", 64, 1, 1L << 16,
    "Memtable size per column family (two memtables at most). Commits that take a snapshot flush them (with " +
      "`changelogCheckpointing=false`, every commit); between snapshots a full memtable flushes in the background. " +
      "This bounds the memory of unflushed writes rather than SST sizes.")
  private val HeapWriteBufferMB = new LongOpt("heapWriteBufferMB", 256, 1, 1L << 20,
    "Writes wait in the heap, per store, until the commit before a snapshot writes them into RocksDB in the " +
      "background (reads look there first). This bounds those buffers **for every store on an executor together**, " +
      "frozen ones included: past it, a store that writes moves its buffer into RocksDB's memtables and writes there " +
      "directly until the total is under it again. At most an eighth of the executor's heap is used, whatever the " +
      "setting.")
  private val Compression = new ChoiceOpt("compression", "zstd", Compressions,
    "SST block compression (zstd at level 1). In checkpoint_bench lz4 makes the SST files snapshots upload 48% " +
      "larger (25% more checkpoint bytes in all) for 4-9% more throughput (docs/benchmarks.md).")
  private val TrackNumKeys = new BoolOpt("trackNumKeys", true,
    "Keep an exact key count per column family (a point read per write, except for keys the store read or found " +
      "by a prefix scan since the last commit). With `false`, `numRowsTotal` is RocksDB's estimate.")
  private val TransferThreads = new LongOpt("transferThreads", 4, 1, 256,
    "Parallel uploads on commit and downloads on load (one pool per executor).")
  private val VerifyChecksumsOnLoad = new BoolOpt("verifyChecksumsOnLoad", true,
    "Check each downloaded file's CRC32C against the manifest. Sizes are always checked.")
  private val OrphanFileGracePeriodMs = new LongOpt("orphanFileGracePeriodMs", 600000, 0, Long.MaxValue,
    "A file that no retained version lists is deleted only once it is older than this, because it may belong to a " +
      "commit still in flight on another executor (a speculative or zombie task attempt). Must exceed the longest commit.")
  private val MaxOpenFiles = new LongOpt("maxOpenFiles", -1, -1, Int.MaxValue,
    "RocksDB's open file limit per instance (-1: unlimited).")
  private val ChangelogCheckpointing = new BoolOpt("changelogCheckpointing", true,
    "`true`: a commit uploads only the version's changelog (its writes) and a manifest; every " +
      "`minDeltasForSnapshot` versions a RocksDB checkpoint is taken and its new SST files are uploaded in the " +
      "background. `false`: every commit flushes, checkpoints and uploads the new SST files before it returns. " +
      "See docs/architecture.md.")
  private val ChangelogCompression = new ChoiceOpt("changelogCompression", "zstd", ChangelogCompressions,
    "How changelog files are compressed (zstd level 3, or LZ4 blocks). Each file records its codec, so a store " +
      "written with one codec loads with any setting; the setting applies to the changelogs written from then on.")
  private val AcquireTimeoutMs = new LongOpt("acquireTimeoutMs", 120000, 1, Long.MaxValue,
    "How long a task waits for a state partition that another task on the executor still holds (an attempt " +
      "retried while the previous one ends) before it fails with Spark's " +
      "`CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR` (Spark's RocksDB provider: `lockAcquireTimeoutMs`).")

  /** Every option, in the order of the docs. */
  val options: Seq[Opt[_]] = Seq(ChangelogCheckpointing, ChangelogCompression, LocalDir, BlockCacheSizeMB, WriteBufferSizeMB,
    HeapWriteBufferMB, Compression, TrackNumKeys, TransferThreads, VerifyChecksumsOnLoad, OrphanFileGracePeriodMs, MaxOpenFiles,
    AcquireTimeoutMs)

  /** The documented option names, for error messages and docs tests. */
  val optionNames: Seq[String] = options.map(_.name)

  /**
   * Checks a session's settings as the provider will, on the driver when a streaming query
   * starts (`KeyedStateExtensions`), so a bad value fails `start()` instead of the first batch.
   */
  def validateSession(settings: Map[String, String]): Unit = {
    fromMap(settings) // reads only the keys under Prefix
    ()
  }

  def apply(storeConf: StateStoreConf): KeyedStateConf =
    fromMap(storeConf.sqlConfs ++ storeConf.extraOptions, storeConf.minVersionsToRetain,
      storeConf.enableStateStoreCheckpointIds)

  def fromMap(
      settings: Map[String, String],
      minVersionsToRetain: Int = 100,
      checkpointIdsEnabled: Boolean = false): KeyedStateConf = {
    val (queryableKeys, others) = settings.filter { case (k, _) => k.startsWith(Prefix) }
      .partition { case (k, _) => k.startsWith(QueryablePrefix) }
    val (ttlKeys, ours) = others.partition { case (k, _) => k.startsWith(Prefix + TtlSettings.Prefix) }
    val unknown = ours.keySet.map(_.stripPrefix(Prefix)) -- optionNames
    if (unknown.nonEmpty) {
      throw KeyedStateErrors.invalidOption(
        s"Unknown keyedstate option(s) ${unknown.toSeq.sorted.map(Prefix + _).mkString(", ")}; " +
          s"allowed: ${optionNames.map(Prefix + _).mkString(", ")}, the TTL options ${Prefix}ttl.* (docs/ttl.md) and " +
          s"${QueryablePrefix}<operator id> (docs/queryable-state.md)")
    }
    def get[T](opt: Opt[T]): T = ours.get(opt.key) match {
      case None => opt.default
      case Some(raw) =>
        opt.parse(raw).getOrElse(throw KeyedStateErrors.invalidOptionValue(opt.key, raw, opt.allowed))
    }
    if (minVersionsToRetain < 1) {
      throw KeyedStateErrors.invalidOptionValue("spark.sql.streaming.minBatchesToRetain",
        minVersionsToRetain.toString, "an integer of at least 1")
    }
    KeyedStateConf(
      localDir = get(LocalDir),
      blockCacheSizeMB = get(BlockCacheSizeMB),
      writeBufferSizeMB = get(WriteBufferSizeMB),
      heapWriteBufferMB = get(HeapWriteBufferMB),
      compression = get(Compression),
      trackNumKeys = get(TrackNumKeys),
      transferThreads = get(TransferThreads).toInt,
      verifyChecksumsOnLoad = get(VerifyChecksumsOnLoad),
      orphanFileGracePeriodMs = get(OrphanFileGracePeriodMs),
      maxOpenFiles = get(MaxOpenFiles).toInt,
      changelogCheckpointing = get(ChangelogCheckpointing),
      changelogCompression = get(ChangelogCompression),
      acquireTimeoutMs = get(AcquireTimeoutMs),
      ttl = TtlSettings.parse(ttlKeys.map { case (k, v) => k.stripPrefix(Prefix) -> v }, Prefix),
      queryableOperators = queryableKeys.map { case (k, v) =>
        val id = k.stripPrefix(QueryablePrefix).toLongOption.filter(_ >= 0)
          .getOrElse(throw KeyedStateErrors.invalidOptionValue(k, k.stripPrefix(QueryablePrefix),
            s"an operator id (an integer of at least 0) after $QueryablePrefix"))
        val name = v.trim
        if (name.isEmpty || name.contains("/")) {
          throw KeyedStateErrors.invalidOptionValue(k, v, "a non-empty name without '/'")
        }
        id -> name
      },
      minVersionsToRetain = minVersionsToRetain,
      checkpointIdsEnabled = checkpointIdsEnabled)
  }
}
