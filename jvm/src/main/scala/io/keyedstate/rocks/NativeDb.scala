package io.keyedstate.rocks

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8

import scala.jdk.CollectionConverters._

import org.rocksdb._

/**
 * The open RocksDB of one [[LocalRocksDB]] and the options it was opened and writes with: their
 * one owner. Also the calls on the database that several parts make: flushing memtables, taking
 * in SST files, and RocksDB's I/O errors as the local disk's.
 */
private[rocks] final class NativeDb(val dir: File, val db: RocksDB, dbOptions: DBOptions, cfOptions: ColumnFamilyOptions) {
  // No write-ahead log: durability comes from the versioned checkpoints.
  val writeOptions: WriteOptions = new WriteOptions().setDisableWAL(true)

  // Files taken in so far: a file may keep sequence number 0, so reused scan iterators must not
  // trust the sequence alone (ScanIterators).
  @volatile private var ingested = 0L
  def ingests: Long = ingested

  /** RocksDB's I/O errors are the local disk's: they name the directory (see `RocksDBResources.failure`). */
  def localIo[T](body: => T): T =
    try body catch { case e: RocksDBException => throw RocksDBResources.failure(dir, e) }

  /** Creates a column family with the instance's options. */
  def createColumnFamily(name: String): ColumnFamilyHandle =
    localIo(db.createColumnFamily(new ColumnFamilyDescriptor(name.getBytes(UTF_8), cfOptions)))

  /** The options of an SST file a column family takes in as its own (the [[SstWriter]] closes them). */
  def sstFileOptions(): Options = new Options(dbOptions, cfOptions)

  /**
   * Flushes the memtables of `families`; without `waitForFlush` it returns at once: the memtables
   * become immutable, new writes go to fresh ones, and RocksDB's background threads write the
   * SSTs (a later waiting flush waits for these too).
   */
  def flush(families: List[ColumnFamilyHandle], waitForFlush: Boolean): Boolean = {
    val opts = new FlushOptions().setWaitForFlush(waitForFlush).setAllowWriteStall(!waitForFlush)
    try localIo {
      try { db.flush(opts, families.asJava); true }
      catch {
        // RocksDB refuses a flush that does not wait while writes are stopped (level 0 past its
        // stop trigger until compactions catch up: ingested buffers on a busy machine reach it).
        // Starting the flush early only spares the next snapshot's flush some work, which that
        // flush then does: a commit or the background spill must not fail for it.
        case e: RocksDBException if !waitForFlush && e.getStatus != null &&
            e.getStatus.getCode == Status.Code.TryAgain =>
          LocalRocksDB.logger.info(s"Background flush of $dir skipped, writes are stopped: ${e.getMessage}")
          false
      }
    } finally opts.close()
  }

  /** Moves `files` into the family; RocksDB must hold everything written before them. */
  def ingest(h: ColumnFamilyHandle, files: Seq[File]): Unit = {
    val opts = new IngestExternalFileOptions().setMoveFiles(true).setAllowGlobalSeqNo(true)
    try localIo(db.ingestExternalFile(h, files.map(_.getAbsolutePath).asJava, opts))
    finally opts.close()
    ingested += 1
  }

  /** Closes the database; `closeHandles` closes its column families' handles, which RocksDB wants closed first. */
  def close(closeHandles: => Unit): Unit = {
    writeOptions.close()
    closeHandles
    db.close()
    dbOptions.close()
    cfOptions.close()
  }
}
