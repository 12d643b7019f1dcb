package io.keyedstate

import java.io.File
import java.util.Locale

import org.apache.spark.sql.execution.streaming.state.StateStoreConf

import io.keyedstate.ttl.TtlSettings

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
    compression: String,
    trackNumKeys: Boolean,
    transferThreads: Int,
    verifyChecksumsOnLoad: Boolean,
    orphanFileGracePeriodMs: Long,
    maxOpenFiles: Int,
    changelogCheckpointing: Boolean,
    // The `ttl.*` options (docs/ttl.md), resolved per operator and column family.
    ttl: TtlSettings,
    // From Spark's own StateStoreConf:
    minVersionsToRetain: Int,
    checkpointIdsEnabled: Boolean)

object KeyedStateConf {
  val Prefix = "spark.sql.streaming.stateStore.keyedstate."

  val Compressions: Seq[String] = Seq("none", "snappy", "lz4", "zstd")

  private sealed abstract class Opt[T](val name: String, val default: T, val allowed: String) {
    def key: String = Prefix + name
    def parse(raw: String): Option[T]
  }
  private final class LongOpt(name: String, default: Long, min: Long, max: Long)
      extends Opt[Long](name, default, s"an integer from $min to $max") {
    def parse(raw: String): Option[Long] =
      raw.trim.toLongOption.filter(v => v >= min && v <= max)
  }
  private final class BoolOpt(name: String, default: Boolean)
      extends Opt[Boolean](name, default, "true or false") {
    def parse(raw: String): Option[Boolean] = raw.trim.toLowerCase(Locale.ROOT).toBooleanOption
  }
  private final class ChoiceOpt(name: String, default: String, choices: Seq[String])
      extends Opt[String](name, default, choices.mkString("one of ", ", ", "")) {
    def parse(raw: String): Option[String] =
      Some(raw.trim.toLowerCase(Locale.ROOT)).filter(choices.contains)
  }
  private final class PathOpt(name: String)
      extends Opt[Option[String]](name, None, "an absolute local directory path") {
    def parse(raw: String): Option[Option[String]] =
      Some(raw.trim).filter(p => new File(p).isAbsolute).map(Some(_))
  }

  private val LocalDir = new PathOpt("localDir")
  private val BlockCacheSizeMB = new LongOpt("blockCacheSizeMB", 64, 1, 1L << 20)
  private val WriteBufferSizeMB = new LongOpt("writeBufferSizeMB", 64, 1, 1L << 16)
  private val Compression = new ChoiceOpt("compression", "lz4", Compressions)
  private val TrackNumKeys = new BoolOpt("trackNumKeys", true)
  private val TransferThreads = new LongOpt("transferThreads", 4, 1, 256)
  private val VerifyChecksumsOnLoad = new BoolOpt("verifyChecksumsOnLoad", true)
  private val OrphanFileGracePeriodMs = new LongOpt("orphanFileGracePeriodMs", 600000, 0, Long.MaxValue)
  private val MaxOpenFiles = new LongOpt("maxOpenFiles", -1, -1, Int.MaxValue)
  private val ChangelogCheckpointing = new BoolOpt("changelogCheckpointing", true)

  private val all: Seq[Opt[_]] = Seq(LocalDir, BlockCacheSizeMB, WriteBufferSizeMB, Compression,
    TrackNumKeys, TransferThreads, VerifyChecksumsOnLoad, OrphanFileGracePeriodMs, MaxOpenFiles,
    ChangelogCheckpointing)

  /** The documented option names, for error messages and docs tests. */
  val optionNames: Seq[String] = all.map(_.name)

  def apply(storeConf: StateStoreConf): KeyedStateConf =
    fromMap(storeConf.sqlConfs ++ storeConf.extraOptions, storeConf.minVersionsToRetain,
      storeConf.enableStateStoreCheckpointIds)

  def fromMap(
      settings: Map[String, String],
      minVersionsToRetain: Int = 100,
      checkpointIdsEnabled: Boolean = false): KeyedStateConf = {
    val (ttlKeys, ours) = settings.filter { case (k, _) => k.startsWith(Prefix) }
      .partition { case (k, _) => k.startsWith(Prefix + TtlSettings.Prefix) }
    val unknown = ours.keySet.map(_.stripPrefix(Prefix)) -- optionNames
    if (unknown.nonEmpty) {
      throw new IllegalArgumentException(
        s"Unknown keyedstate option(s) ${unknown.toSeq.sorted.map(Prefix + _).mkString(", ")}; " +
          s"allowed: ${optionNames.map(Prefix + _).mkString(", ")} and the TTL options ${Prefix}ttl.* (docs/ttl.md)")
    }
    def get[T](opt: Opt[T]): T = ours.get(opt.key) match {
      case None => opt.default
      case Some(raw) =>
        opt.parse(raw).getOrElse(throw new IllegalArgumentException(
          s"Invalid value '$raw' for ${opt.key}: allowed is ${opt.allowed}"))
    }
    if (minVersionsToRetain < 1) {
      throw new IllegalArgumentException(
        s"Invalid value '$minVersionsToRetain' for spark.sql.streaming.minBatchesToRetain: " +
          "allowed is an integer of at least 1")
    }
    KeyedStateConf(
      localDir = get(LocalDir),
      blockCacheSizeMB = get(BlockCacheSizeMB),
      writeBufferSizeMB = get(WriteBufferSizeMB),
      compression = get(Compression),
      trackNumKeys = get(TrackNumKeys),
      transferThreads = get(TransferThreads).toInt,
      verifyChecksumsOnLoad = get(VerifyChecksumsOnLoad),
      orphanFileGracePeriodMs = get(OrphanFileGracePeriodMs),
      maxOpenFiles = get(MaxOpenFiles).toInt,
      changelogCheckpointing = get(ChangelogCheckpointing),
      ttl = TtlSettings.parse(ttlKeys.map { case (k, v) => k.stripPrefix(Prefix) -> v }, Prefix),
      minVersionsToRetain = minVersionsToRetain,
      checkpointIdsEnabled = checkpointIdsEnabled)
  }
}
