package io.keyedstate.rocks

import java.io.File

import org.rocksdb._

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.KeyedStateErrors

/**
 * What every working instance shares and opens with: the native library, the one block cache
 * of the executor JVM, the database's and column families' options, and what RocksDB's errors
 * mean for the local disk.
 */
object RocksDBResources {
  RocksDB.loadLibrary()

  // One block cache per executor JVM, shared by every partition's instance, so memory stays
  // bounded however many partitions an executor hosts. Sized by the first instance's conf.
  @volatile private var sharedCache: Cache = _
  private def blockCache(sizeMB: Long): Cache = synchronized {
    if (sharedCache == null) sharedCache = new LRUCache(sizeMB * 1024 * 1024)
    sharedCache
  }

  private[rocks] def compressionType(name: String): CompressionType = name match {
    case "none" => CompressionType.NO_COMPRESSION
    case "snappy" => CompressionType.SNAPPY_COMPRESSION
    case "lz4" => CompressionType.LZ4_COMPRESSION
    case "zstd" => CompressionType.ZSTD_COMPRESSION
  }

  /** Every column family's options (the bench opens a raw RocksDB with them: bench/jvm). */
  private[keyedstate] def columnFamilyOptions(conf: KeyedStateConf): ColumnFamilyOptions = {
    val table = new BlockBasedTableConfig()
      .setBlockCache(blockCache(conf.blockCacheSizeMB))
      .setFilterPolicy(new BloomFilter(10, false))
      .setBlockSize(16 * 1024)
      .setFormatVersion(5)
    new ColumnFamilyOptions()
      .setTableFormatConfig(table)
      .setCompressionType(compressionType(conf.compression))
      // zstd (the default) at level 1: SSTs are compressed on flush and compaction, in the
      // commit's and the tasks' time; level 3 made an aggregation's SSTs only 4% smaller for
      // 10-15% more flush and compaction time.
      .setCompressionOptions(new CompressionOptions().setLevel(1))
      .setWriteBufferSize(conf.writeBufferSizeMB * 1024 * 1024)
      .setMaxWriteBufferNumber(2)
      // A snapshot makes two L0 files (the flush the commit before starts, then its own; see
      // VersionLineage), and an L0 compaction rewrites L1, which the next snapshot uploads whole:
      // twice RocksDB's default trigger keeps that to every fourth snapshot, as one file each did.
      .setLevel0FileNumCompactionTrigger(8)
      .setMergeOperator(new StringAppendOperator(""))
  }

  private val ManifestPreallocationBytes = 64L * 1024

  /** The database's options (the bench opens a raw RocksDB with them: bench/jvm). */
  private[keyedstate] def dbOptions(conf: KeyedStateConf): DBOptions =
    new DBOptions()
      .setCreateIfMissing(true)
      .setCreateMissingColumnFamilies(true)
      .setMaxOpenFiles(conf.maxOpenFiles)
      .setAvoidFlushDuringShutdown(true)
      .setMaxManifestFileSize(8L * 1024 * 1024)
      // RocksDB reserves (fallocate) 4 MB for each MANIFEST by default: 4 MB of local disk per
      // state partition before any state, gone from a small disk (and a full one fails at open).
      // keyedstate's MANIFESTs grow by a record per flush; 64 KB steps are enough.
      .setManifestPreallocationSize(ManifestPreallocationBytes)
      .setInfoLogLevel(InfoLogLevel.WARN_LEVEL)
      .setKeepLogFileNum(2)
      // No periodic statistics dump (it writes to the info log at INFO level, which the WARN level
      // above discards). RocksDB's timer thread ran it at a random moment in each instance's
      // period, and 9.8's DumpStats crashed the JVM (SIGSEGV) when it met a column family being
      // dropped (LocalRocksDBConcurrencySuite's stress test, 2026-11-27).
      .setStatsDumpPeriodSec(0)
      .setStatsPersistPeriodSec(0)

  /**
   * An I/O error of the working instance is the local disk's (full, read-only, failing: RocksDB
   * touches nothing else): a `LocalDiskException` naming the directory. A file RocksDB expected
   * and did not find (a damaged snapshot) and every other error stay as they are.
   */
  private[keyedstate] def failure(dir: File, e: RocksDBException): Exception = {
    val status = e.getStatus
    // rocksdbjni has no sub-code for RocksDB's PathNotFound: a missing file reads ENOENT's text.
    val missingFile = Option(e.getMessage).exists(_.contains("No such file or directory"))
    if (status != null && status.getCode == Status.Code.IOError && !missingFile) {
      KeyedStateErrors.localDiskWrite("the working RocksDB instance", dir, KeyedStateConf.localDirOf(dir),
        KeyedStateConf.LocalDirKey, e)
    } else e
  }
}
