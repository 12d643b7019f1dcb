package io.keyedstate.rocks

import java.io.File

import scala.jdk.CollectionConverters._

import org.rocksdb._

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.LocalDiskException

/**
 * The working RocksDB instance of one state store partition, on local disk.
 *
 * Every Spark column family is a real RocksDB column family (Spark's "default" is RocksDB's
 * default), so dropping one is O(1) and each can get its own options later (TTL, compaction).
 * The write-ahead log is off: durability comes from the versioned checkpoints that
 * [[io.keyedstate.checkpoint.commit.SnapshotStrategy]] uploads on commit.
 *
 * A facade over parts with one job each, lowest first: [[NativeDb]] (the database and its
 * options), [[FamilyHandles]] (the column families' handles, held by every call),
 * [[BufferedWrites]] (writes waiting in the heap, their background spill, point reads through
 * them) and [[ScanIterators]] (scans' native iterators). What spans parts (a family's drop, the
 * close) is ordered here.
 */
final class LocalRocksDB private (native: NativeDb, initialHandles: Seq[ColumnFamilyHandle], heapBufferBytes: Long)
    extends AutoCloseable {
  import native.{db, localIo, writeOptions}

  val dir: File = native.dir

  // The buffer's lock, also the one the family map changes under (see FamilyHandles).
  private val lock = new Object
  /** Tests only: pauses and faults injected into the write path. */
  private[keyedstate] val testHooks = new TestHooks
  private val families = new FamilyHandles(native, initialHandles, lock)
  private val buffered = new BufferedWrites(native, families, lock, heapBufferBytes, testHooks)
  private val scans = new ScanIterators(native, families, buffered)

  /** Throws the failure that lost buffered writes, if any: a commit must not record them. */
  def throwIfWritesLost(): Unit = buffered.throwIfWritesLost()

  /** Whether no buffered write was lost (a failed instance must be rebuilt, not reused). */
  def healthy: Boolean = buffered.healthy

  def columnFamilies: Set[String] = families.names
  def hasColumnFamily(name: String): Boolean = families.contains(name)

  def createColumnFamily(name: String): Unit = families.usingDb("create a column family")(families.create(name))

  /** Drops a column family; the default one cannot be dropped, so it is emptied instead. */
  def dropColumnFamily(name: String): Boolean = families.usingDb("drop a column family") {
    families.get(name) match {
      case None => false
      case Some(_) if name == LocalRocksDB.DefaultColumnFamily =>
        buffered.dropFamily(name)
        scans.release(name)
        families.using(name, "empty the default column family") { h =>
          withIterator(h) { it =>
            it.seekToFirst()
            while (it.isValid) { db.delete(h, writeOptions, it.key()); it.next() }
          }
        }
        true
      case Some(family) =>
        // Gone for new reads before its buffered writes go: a read in another thread finds the
        // family whole or not at all, never emptied.
        families.remove(name)
        family.retire() // reads of it in other threads end first; new ones fail
        buffered.dropFamily(name)
        scans.closeFamily(family) // its iterators go before it, scans left open included (their next step fails)
        families.dropNative(family)
        true
    }
  }

  /** The value of `key`, or null. */
  def get(cf: String, key: Array[Byte]): Array[Byte] = families.using(cf, "get")(buffered.get(_, cf, key))

  /** Whether `key` exists, its value not copied out. */
  def exists(cf: String, key: Array[Byte]): Boolean = families.using(cf, "exists")(buffered.exists(_, cf, key))

  def put(cf: String, key: Array[Byte], value: Array[Byte]): Unit = buffered.write(WriteTable.Put, cf, key, value)
  def merge(cf: String, key: Array[Byte], value: Array[Byte]): Unit = buffered.write(WriteTable.Merge, cf, key, value)
  def delete(cf: String, key: Array[Byte]): Unit = buffered.write(WriteTable.Delete, cf, key, null)

  /**
   * Deletes the keys from `begin` (included) to `end` (excluded), in RocksDB directly. A range
   * that ends where or before it begins is empty (RocksDB would refuse it).
   */
  def deleteRange(cf: String, begin: Array[Byte], end: Array[Byte]): Unit = families.using(cf, "deleteRange") { h =>
    if (java.util.Arrays.compareUnsigned(begin, end) < 0) {
      localIo(buffered.currentFor(cf).deleteRange(h, writeOptions, begin, end)) // after the family's buffered writes
    }
  }

  /**
   * Freezes the write buffer and writes it into RocksDB in the background, then starts flushing
   * the memtables: the commit before a snapshot (see [[BufferedWrites.flushInBackground]]). False
   * when nothing was started (RocksDB refused the flush: writes stopped).
   */
  def flushInBackground(): Boolean = families.usingDb("flush")(buffered.flushInBackground())

  /**
   * Key-ordered entries with `lower <= key < upper`. The iterator closes its native resources
   * when exhausted or through `close()`.
   */
  def scan(
      cf: String,
      lower: Option[Array[Byte]],
      upper: Option[Array[Byte]]): ClosableIterator[(Array[Byte], Array[Byte])] = scans.scan(cf, lower, upper)

  /** Whether the family stores no entry at all (an expired one counts: it is stored). */
  def isEmpty(cf: String): Boolean = {
    // Buffered writes count as entries (deletes too): the buffer is not written in for this.
    buffered.entries(_.entriesOf(cf)) == 0 && families.using(cf, "isEmpty") { h =>
      val it = db.newIterator(h)
      try {
        it.seekToFirst()
        if (!it.isValid) localIo(it.status()) // an I/O error ends an iterator too: it is thrown, not read as empty
        !it.isValid
      } finally it.close()
    }
  }

  /** Key-ordered entries whose key starts with `prefix` (on the family's reused iterator: [[ScanIterators]]). */
  def prefixScan(cf: String, prefix: Array[Byte]): ClosableIterator[(Array[Byte], Array[Byte])] =
    scans.prefixScan(cf, prefix)

  /** Closes the iterators prefix scans keep (they pin memtables and SST files): a store's end. */
  def releaseScanIterators(): Unit = scans.releaseAll()

  private def withIterator[T](h: ColumnFamilyHandle)(f: RocksIterator => T): T = {
    val it = buffered.current.newIterator(h)
    try f(it) finally it.close()
  }

  // Snapshots not closed yet: the instance's close closes them first (see DbSnapshot).
  private val openSnapshots = java.util.concurrent.ConcurrentHashMap.newKeySet[DbSnapshot]()

  /**
   * A read-only view of everything written so far, which other threads may read while writes go
   * on (the committed version a lookup reads). The heap buffer is written into RocksDB's
   * memtables first: the snapshot is RocksDB's and sees only what RocksDB holds.
   */
  def snapshot(): DbSnapshot = families.usingDb("take a snapshot") {
    val db = buffered.current
    val taken = new DbSnapshot(native, families, db.getSnapshot, s => openSnapshots.remove(s))
    openSnapshots.add(taken)
    taken
  }

  /** Writes every buffered write into RocksDB and flushes every column family's memtable to SST files. */
  def flush(): Unit = {
    buffered.written(None, asFiles = true)
    families.usingAll("flush")(native.flush(_, waitForFlush = true))
  }

  /** Tests only: changes a family's mutable options, to bring RocksDB into states such as stopped writes. */
  private[keyedstate] def setOptionsForTest(cf: String, options: MutableColumnFamilyOptions): Unit =
    families.using(cf, "setOptions")(db.setOptions(_, options))

  /** A native checkpoint (hard links of the SSTs plus copies of the small files) in `target`. */
  def checkpoint(target: File): Unit = families.usingDb("checkpoint") {
    val cp = Checkpoint.create(buffered.current)
    try localIo(cp.createCheckpoint(target.getAbsolutePath)) finally cp.close()
  }

  /** Entries not in SST files: keys in the heap's buffers, writes in the memtables. */
  def unflushedEntries: Long = buffered.entries(_.entries) +
    sumOfProperties("rocksdb.num-entries-active-mem-table", "rocksdb.num-entries-imm-mem-tables")

  /** RocksDB's estimate, plus the keys buffered in the heap (some may be in RocksDB too). */
  def estimateNumKeys(cf: String): Long =
    families.using(cf, "estimateNumKeys")(db.getLongProperty(_, "rocksdb.estimate-num-keys")) +
      buffered.entries(_.entriesOf(cf))

  /** The heap's buffers, memtables and table readers (index and filter blocks outside the shared block cache). */
  def memoryUsageBytes: Long = buffered.entries(_.heapBytes) +
    sumOfProperties("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem")

  /** Tests only (of the bound): the heap bytes this instance's write buffers hold, live and frozen. */
  private[keyedstate] def heapBufferedBytes: Long = buffered.entries(_.heapBytes)

  def totalSstFilesBytes: Long = sumOfProperties("rocksdb.total-sst-files-size")

  /** RocksDB's integer `properties`, summed over every column family. */
  private def sumOfProperties(properties: String*): Long = families.usingAll("read properties") { handles =>
    handles.iterator.map(h => properties.iterator.map(db.getLongProperty(h, _)).sum).sum
  }

  def compactRange(): Unit = families.usingAll("compact")(_.foreach(h => localIo(buffered.current.compactRange(h))))

  /**
   * Adds SST files written by [[SstWriter]] to a column family in one step, moving (not copying)
   * them into the database. The files may overlap each other; their keys must be new.
   */
  def ingest(cf: String, files: Seq[File]): Unit = if (files.nonEmpty) families.using(cf, "ingest") { h =>
    buffered.written(None)
    native.ingest(h, files)
  }

  /**
   * Compacts the keys from `begin` to `end` (both included) of one column family down to the last
   * level, the last level included, so deleted values and their tombstones leave the SST files.
   */
  def compactRange(cf: String, begin: Array[Byte], end: Array[Byte]): Unit = {
    val opts = new CompactRangeOptions()
      .setBottommostLevelCompaction(CompactRangeOptions.BottommostLevelCompaction.kForceOptimized)
    try families.using(cf, "compactRange")(h => localIo(buffered.current.compactRange(h, begin, end, opts)))
    finally opts.close()
  }

  override def close(): Unit = if (!families.isClosing) {
    // Snapshots go first, once their reads in flight end (those hold family handles).
    openSnapshots.forEach(_.close())
    closeDatabase()
  }

  private def closeDatabase(): Unit = if (families.retireAll()) {
    // Operations in flight in other threads (a lookup, a maintenance scan) ended first; later ones fail.
    // Writes still buffered belong to versions that are lost with the instance or were never
    // committed; the background write may not be stopped half-way: it runs into the database.
    buffered.awaitBackgroundWrite()
    scans.closeAll()
    buffered.release()
    native.close(families.closeRetired())
    buffered.deleteSpillDir() // a spill's file, if it failed
  }
}

object LocalRocksDB {
  val DefaultColumnFamily = "default"

  private[rocks] val logger = org.slf4j.LoggerFactory.getLogger(classOf[LocalRocksDB])

  /** `heapWriteBufferMB`, at most an eighth of the JVM's heap (a small executor's default stays safe). */
  private def heapBufferBytes(conf: KeyedStateConf): Long =
    math.min(conf.heapWriteBufferMB * 1024 * 1024, Runtime.getRuntime.maxMemory / 8)

  /** Tests and bench/memory_bound_bench.py: bytes the write buffers of every instance in this JVM hold. */
  private[keyedstate] def bufferedBytesInJvm: Long = WriteBuffer.executorTotal

  /** Opens (or creates) the database in `dir` with all its column families. */
  def open(dir: File, conf: KeyedStateConf): LocalRocksDB = {
    dir.mkdirs()
    val dbOptions = RocksDBResources.dbOptions(conf)
    val cfOptions = RocksDBResources.columnFamilyOptions(conf)
    val existing =
      if (new File(dir, "CURRENT").exists()) {
        val lo = new Options()
        try RocksDB.listColumnFamilies(lo, dir.getAbsolutePath).asScala.toSeq finally lo.close()
      } else Seq(RocksDB.DEFAULT_COLUMN_FAMILY)
    val descriptors = existing.map(n => new ColumnFamilyDescriptor(n, cfOptions)).asJava
    val handles = new java.util.ArrayList[ColumnFamilyHandle]()
    val db =
      try RocksDB.open(dbOptions, dir.getAbsolutePath, descriptors, handles)
      catch {
        case e: RocksDBException =>
          dbOptions.close(); cfOptions.close()
          throw RocksDBResources.failure(dir, e) match {
            case local: LocalDiskException => local
            case _ => new IllegalStateException(s"Cannot open RocksDB at $dir: ${e.getMessage}", e)
          }
      }
    new LocalRocksDB(new NativeDb(dir, db, dbOptions, cfOptions), handles.asScala.toSeq, heapBufferBytes(conf))
  }
}
