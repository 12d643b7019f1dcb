package io.keyedstate.rocks

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8
import java.util.concurrent.ConcurrentHashMap

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import org.rocksdb._

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors, LocalDiskException}

/**
 * The working RocksDB instance of one state store partition, on local disk.
 *
 * Every Spark column family is a real RocksDB column family (Spark's "default" is RocksDB's
 * default), so dropping one is O(1) and each can get its own options later (TTL, compaction).
 * The write-ahead log is off: durability comes from the versioned checkpoints that
 * [[io.keyedstate.checkpoint.commit.SnapshotStrategy]] uploads on commit.
 */
final class LocalRocksDB private (
    val dir: File,
    db: RocksDB,
    dbOptions: DBOptions,
    cfOptions: ColumnFamilyOptions,
    initialHandles: Seq[ColumnFamilyHandle],
    heapBufferBytes: Long) extends AutoCloseable {

  // The column families by name: an immutable map, replaced under `lock` when the task thread
  // creates or drops one, read without a lock by every thread. Every operation holds the handles
  // it uses ([[using]]); what reads or writes the database as a whole holds the default family's,
  // which only the close retires.
  @volatile private var families: Map[String, GuardedHandle] =
    initialHandles.map { h => val name = new String(h.getName, UTF_8); name -> new GuardedHandle(name, h) }.toMap
  @volatile private var lastUsed: GuardedHandle = _ // the family of the last operation: usually the next one's
  private val closing = new java.util.concurrent.atomic.AtomicBoolean(false)

  private val writeOptions = new WriteOptions().setDisableWAL(true)
  // Every native iterator open, with the family it reads: a drop closes its family's.
  private val openIterators = new ConcurrentHashMap[RocksIterator, GuardedHandle]()

  // Prefix scans reuse one iterator per column family: a native iterator, its ReadOptions and
  // its bound per scan cost as much as a short scan itself. An iterator sees the database as of
  // its creation, so a scan after any write (RocksDB's sequence number moved) refreshes it first;
  // ingesting files or dropping the family releases it. A scan that starts while the family's
  // iterator is still in use opens its own. A kept iterator pins its memtables and SST files
  // until [[releaseScanIterators]] (commit and release of a store).
  private final class ReusedIterator(val it: RocksIterator, val family: GuardedHandle, var atSequence: Long,
      var atIngests: Long) {
    var inUse = false
    var retired = false // released while in use: closed when its scan ends
    def close(): Unit = closeIterator(it)
  }

  /** Closes an open native iterator, once (a drop or a close may have closed it already). */
  private def closeIterator(it: RocksIterator): Unit = if (openIterators.remove(it) != null) it.close()
  private val prefixIterators = mutable.HashMap[String, ReusedIterator]()

  // Writes wait in the heap, as RocksDB's own memtables would hold them but without their cost:
  // a put is a hash insert, a read of a key written since is a hash lookup, and RocksDB's
  // memtables stay empty, so every other read skips them. The commit before a snapshot freezes
  // the buffer and a background thread writes it into RocksDB in key order and flushes
  // ([[flushInBackground]]); reads look in the buffer, then the frozen one, then RocksDB. What
  // reads the database as a whole (scans, flushes, checkpoints) writes the buffer in first
  // (`current`). Over the executor-wide bound (`heapWriteBufferMB`, every store's buffers), a
  // store's writes go into RocksDB directly (see `write`). The lock guards the buffer: with Spark's pipelined Python runner a keyed function's
  // lookups read in another thread than the one that writes, and the maintenance thread scans.
  private val lock = new Object
  private var buffer = new WriteBuffer
  // The previous buffer, read-only from the moment it is frozen; null once RocksDB holds it.
  @volatile private var frozen: WriteBuffer = null
  @volatile private var frozenSpill: java.util.concurrent.Future[_] = null
  // The failure of writing buffered writes into RocksDB (a full disk): some of them are lost (or,
  // for merges, may be applied twice), so every later read, write and commit fails with it,
  // whichever thread met it first, and the provider rebuilds the instance.
  @volatile private var lostWrites: Throwable = null

  /** Throws the failure that lost buffered writes, if any: a commit must not record them. */
  def throwIfWritesLost(): Unit = if (lostWrites != null) throw lostWrites

  /** Whether no buffered write was lost (a failed instance must be rebuilt, not reused). */
  def healthy: Boolean = lostWrites == null

  /** The database with every write made so far in it: what scans and file operations use. */
  private def current: RocksDB = written(None)

  /** The database with every write made so far to `cf` in it. */
  private def currentFor(cf: String): RocksDB = written(Some(cf))

  /** The database once the buffered writes of `only` that family (or of all) are in it; see [[spill]]. */
  private def written(only: Option[String], asFiles: Boolean = false): RocksDB = {
    lockedAfterFrozenSpill(spill(only.fold(buffer.columnFamilies.toList)(List(_)), asFiles))
    db
  }

  /**
   * `body` under the buffer's lock once the frozen buffer is in RocksDB: waited for without the
   * lock first (other threads' reads need it meanwhile), then checked again under it.
   */
  private def lockedAfterFrozenSpill[T](body: => T): T = {
    awaitFrozenSpill()
    lock.synchronized { awaitFrozenSpill(); body }
  }

  def columnFamilies: Set[String] = families.keySet
  def hasColumnFamily(name: String): Boolean = families.contains(name)

  /** `body` with `cf`'s handle, held: a drop or a close waits until it returns. */
  private def using[T](cf: String, op: String)(body: ColumnFamilyHandle => T): T = usingFamily(cf, op)(f => body(f.handle))

  private def usingFamily[T](cf: String, op: String)(body: GuardedHandle => T): T = {
    val family = acquire(cf, op)
    try body(family) finally family.release()
  }

  /** `body` with `family` held, if it is still in use; what is left of a dropped or closed one fails. */
  private def holding[T](family: GuardedHandle, op: String)(body: => T): T = {
    if (!family.tryAcquire()) {
      if (closing.get()) throw closedError(op)
      throw KeyedStateErrors.badState(ErrorId.UnsupportedOperation,
        s"Cannot $op: column family '${family.name}' of RocksDB at $dir was dropped")
    }
    try body finally family.release()
  }

  /** `body` while the database stays open (the default family's handle held). */
  private def usingDb[T](op: String)(body: => T): T = using(LocalRocksDB.DefaultColumnFamily, op)(_ => body)

  /** `body` with the handles of every family (those being dropped left out), the database held open. */
  private def usingAll[T](op: String)(body: List[ColumnFamilyHandle] => T): T = usingDb(op) {
    val held = families.values.filter(_.tryAcquire()).toList
    try body(held.map(_.handle)) finally held.foreach(_.release())
  }

  private def closedError(op: String): Exception = KeyedStateErrors.badState(ErrorId.StoreClosed,
    s"Cannot $op: the RocksDB instance at $dir is closed (its store was aborted, unloaded or reloaded)")

  private def acquire(cf: String, op: String): GuardedHandle = {
    val last = lastUsed
    if (last != null && last.name == cf && last.tryAcquire()) last
    else families.get(cf) match {
      case Some(family) if family.tryAcquire() =>
        lastUsed = family
        family
      case _ if closing.get() => throw closedError(op)
      case _ => throw KeyedStateErrors.badState(ErrorId.UnsupportedOperation,
        s"Cannot $op: column family '$cf' does not exist in RocksDB at $dir")
    }
  }

  def createColumnFamily(name: String): Unit = usingDb("create a column family") {
    lock.synchronized {
      if (!families.contains(name)) {
        val h = localIo(db.createColumnFamily(new ColumnFamilyDescriptor(name.getBytes(UTF_8), cfOptions)))
        families += name -> new GuardedHandle(name, h)
      }
    }
  }

  /** RocksDB's I/O errors are the local disk's: they name the directory (see `RocksDBResources.failure`). */
  private def localIo[T](body: => T): T =
    try body catch { case e: RocksDBException => throw RocksDBResources.failure(dir, e) }

  /** Drops a column family; the default one cannot be dropped, so it is emptied instead. */
  def dropColumnFamily(name: String): Boolean = usingDb("drop a column family") {
    // Its waiting writes go with it; the frozen ones are in RocksDB first (their background write
    // uses the handle), so a family created again under the name starts with nothing buffered.
    def dropBuffered(): Unit = lockedAfterFrozenSpill(buffer.remove(name))
    families.get(name) match {
      case None => false
      case Some(_) if name == LocalRocksDB.DefaultColumnFamily =>
        dropBuffered()
        releaseScanIterator(name)
        using(name, "empty the default column family") { h =>
          withIterator(h) { it =>
            it.seekToFirst()
            while (it.isValid) { db.delete(h, writeOptions, it.key()); it.next() }
          }
        }
        true
      case Some(family) =>
        // Gone for new reads before its buffered writes go: a read in another thread finds the
        // family whole or not at all, never emptied.
        lock.synchronized(families -= name)
        family.retire() // reads of it in other threads end first; new ones fail
        dropBuffered()
        // Its iterators go before it, scans left open included (their next step fails).
        prefixIterators.synchronized {
          if (prefixIterators.get(name).exists(_.family eq family)) prefixIterators.remove(name)
        }
        openIterators.asScala.collect { case (it, f) if f eq family => it }.foreach(closeIterator)
        localIo(db.dropColumnFamily(family.handle))
        family.handle.close()
        true
    }
  }

  /** Tests: runs before a point read goes into RocksDB, its family's handle held. */
  @volatile private[keyedstate] var beforeNativeReadForTest: () => Unit = null
  private def beforeNativeRead(): Unit = { val hook = beforeNativeReadForTest; if (hook != null) hook() }

  /** The value of `key`, or null. */
  def get(cf: String, key: Array[Byte]): Array[Byte] = using(cf, "get") { h =>
    val buffered = lock.synchronized {
      throwIfWritesLost()
      val t = buffer.tableOrNull(cf)
      val i = if (t == null) -1 else t.find(key)
      if (i < 0) LocalRocksDB.NotBuffered
      else t.kind(i) match {
        case WriteTable.Put => t.value(i)
        case WriteTable.Delete => null
        // Under the lock: no spill moves these operands into RocksDB before the base is read.
        case _ => KeyBytes.appended(getBelowBuffer(h, cf, key), t.value(i))
      }
    }
    if (buffered ne LocalRocksDB.NotBuffered) buffered else getBelowBuffer(h, cf, key)
  }

  /** What the frozen buffer, then RocksDB, hold for `key`. */
  private def getBelowBuffer(h: ColumnFamilyHandle, cf: String, key: Array[Byte]): Array[Byte] = {
    val f = frozen
    val t = if (f == null) null else f.tableOrNull(cf)
    val i = if (t == null) -1 else t.find(key)
    if (i < 0) { beforeNativeRead(); PointReads.get(db, h, key) }
    else t.kind(i) match {
      case WriteTable.Put => t.value(i)
      case WriteTable.Delete => null
      // Its operands may or may not be in RocksDB yet: read once they are.
      case _ => awaitFrozenSpill(); PointReads.get(db, h, key)
    }
  }

  /** Whether `key` exists, its value not copied out. */
  def exists(cf: String, key: Array[Byte]): Boolean = using(cf, "exists") { h =>
    val kind = lock.synchronized { throwIfWritesLost(); buffer.kindOf(cf, key) }
    if (kind != WriteBuffer.Missing) kind != WriteTable.Delete
    else {
      val f = frozen
      val below = if (f == null) WriteBuffer.Missing else f.kindOf(cf, key)
      if (below != WriteBuffer.Missing) below != WriteTable.Delete
      else { beforeNativeRead(); PointReads.exists(db, h, key) }
    }
  }

  def put(cf: String, key: Array[Byte], value: Array[Byte]): Unit = write(WriteTable.Put, cf, key, value)
  def merge(cf: String, key: Array[Byte], value: Array[Byte]): Unit = write(WriteTable.Merge, cf, key, value)
  def delete(cf: String, key: Array[Byte]): Unit = write(WriteTable.Delete, cf, key, null)

  private def write(kind: Byte, cf: String, key: Array[Byte], value: Array[Byte]): Unit = {
    val overBound = WriteBuffer.overBound(heapBufferBytes)
    // Over the bound, RocksDB must hold the frozen writes before newer ones go in directly (they
    // go in as files, newer than the memtables). Waited for without the lock: reads go on meanwhile.
    if (overBound) awaitFrozenSpill()
    lock.synchronized {
      throwIfWritesLost()
      if (!families.contains(cf)) using(cf, "write")(_ => ()) // names the missing family, or the closed instance
      if (overBound) {
        // The executor's buffers hold the bound: this store's go into RocksDB, and the write too.
        spill(buffer.columnFamilies.toList)
        using(cf, "write")(h => localIo(kind match {
          case WriteTable.Put => db.put(h, writeOptions, key, value)
          case WriteTable.Merge => db.merge(h, writeOptions, key, value)
          case _ => db.delete(h, writeOptions, key)
        }))
      } else {
        val t = buffer.tableFor(cf)
        val before = t.heapBytes
        kind match {
          case WriteTable.Put => t.put(key, value)
          case WriteTable.Merge => t.merge(key, value)
          case _ => t.delete(key)
        }
        buffer.accountFor(before, t)
      }
    }
  }

  /**
   * Deletes the keys from `begin` (included) to `end` (excluded), in RocksDB directly. A range
   * that ends where or before it begins is empty (RocksDB would refuse it).
   */
  def deleteRange(cf: String, begin: Array[Byte], end: Array[Byte]): Unit = using(cf, "deleteRange") { h =>
    if (java.util.Arrays.compareUnsigned(begin, end) < 0) {
      localIo(currentFor(cf).deleteRange(h, writeOptions, begin, end)) // after the family's buffered writes
    }
  }

  /**
   * Writes the buffered writes of `cfs` into RocksDB (the frozen buffer's first: they are older),
   * under `lock`: into the memtables, or `asFiles` as SST files RocksDB takes in (a flush's: the
   * memtables would be flushed next). A failure loses them (see `lostWrites`).
   */
  private def spill(cfs: List[String], asFiles: Boolean = false): Unit = {
    awaitFrozenSpill()
    cfs.foreach { cf =>
      val t = buffer.tableOrNull(cf)
      if (t != null) {
        using(cf, "write buffered writes")(h => keepingFailure(if (asFiles) ingestInto(h, t) else writeInto(h, t)))
        buffer.remove(cf)
      }
    }
  }

  /**
   * Freezes the buffer and writes it into RocksDB in the background, then starts flushing the
   * memtables: the commit before a snapshot, so the snapshot's own flush holds one batch (see
   * VersionLineage). Reads meanwhile look in the frozen buffer; anything that needs RocksDB to
   * hold every write waits for the background write first. False when nothing was started
   * (RocksDB refused the flush: writes stopped).
   */
  def flushInBackground(): Boolean = usingDb("flush")(lockedAfterFrozenSpill(freeze())) // the previous one's first

  private def freeze(): Boolean = {
    // The background write holds no handle: a drop and the close wait for it before theirs go.
    val toFlush = families.values.map(_.handle).toList
    if (buffer.isEmpty) flushAll(toFlush, waitForFlush = false)
    else {
      val f = buffer
      val tables = f.columnFamilies.toList.map(cf => (families(cf).handle, f.tableOrNull(cf)))
      val task = new java.util.concurrent.FutureTask[Unit](() => {
        Option(beforeBackgroundWriteForTest).foreach(_())
        keepingFailure {
          tables.foreach { case (h, t) => ingestInto(h, t) }
          flushAll(toFlush, waitForFlush = false) // what scans and the bound wrote into the memtables
        }
        frozen = null // RocksDB holds it all now (after a failure reads keep using it: see lostWrites)
        f.release()
      })
      // The task is known before the frozen buffer is: a reader that finds a merge in it waits for it.
      frozenSpill = task
      buffer = new WriteBuffer
      frozen = f
      LocalRocksDB.spillThreads.execute(task)
      true
    }
  }

  /** Waits until the frozen buffer, if any, is in RocksDB; throws if its writes were lost. */
  private def awaitFrozenSpill(): Unit = {
    val s = frozenSpill
    if (s != null) {
      try s.get() catch { case _: java.util.concurrent.ExecutionException => } // recorded in lostWrites
      lock.synchronized { if (frozenSpill eq s) frozenSpill = null } // not a newer one, frozen meanwhile
    }
    throwIfWritesLost()
  }

  /** Runs `body`; a failure is kept in `lostWrites` (unless one is kept already) and thrown. */
  private def keepingFailure(body: => Unit): Unit =
    try {
      val fault = spillFault
      if (fault != null) throw fault
      body
    } catch {
      case e: Throwable =>
        if (lostWrites == null) lostWrites = e match {
          case r: RocksDBException => RocksDBResources.failure(dir, r)
          case other => other
        }
        throw lostWrites
    }

  /**
   * One frozen table's writes as one SST file (in key order, the family's table options) that
   * RocksDB then takes in: written once, compressed once, with no memtable insert and no flush.
   * The file is newer than everything in the family (nothing else writes RocksDB meanwhile).
   */
  private def ingestInto(h: ColumnFamilyHandle, t: WriteTable): Unit = {
    spillDir.mkdirs()
    val writer = new SstWriter(new File(spillDir, s"${java.util.UUID.randomUUID()}.sst"), new Options(dbOptions, cfOptions))
    try {
      localIo {
        t.foreachInKeyOrder { (kind, key, value) =>
          kind match {
            case WriteTable.Put => writer.put(key, value)
            case WriteTable.Merge => writer.merge(key, value)
            case _ => writer.delete(key)
          }
        }
        writer.finish()
      }
      ingestFiles(h, Seq(writer.file))
    } finally {
      writer.close()
      writer.file.delete() // moved into the database unless the ingest failed
    }
  }
  // Where frozen tables' SST files are written before RocksDB takes them: beside the database.
  private def spillDir: File = new File(dir.getParentFile, dir.getName + ".spill")
  @volatile private var ingests = 0L

  /** One table's writes, in key order, in batches (a put costs 2.5 times more applied alone). */
  private def writeInto(h: ColumnFamilyHandle, t: WriteTable): Unit = {
    val batch = new WriteBatch()
    try {
      var bytes = 0L
      t.foreachInKeyOrder { (kind, key, value) =>
        kind match {
          case WriteTable.Put => batch.put(h, key, value)
          case WriteTable.Merge => batch.merge(h, key, value)
          case _ => batch.delete(h, key)
        }
        bytes += key.length + (if (value == null) 0 else value.length)
        if (batch.count >= LocalRocksDB.BatchOps || bytes >= LocalRocksDB.BatchBytes) {
          db.write(writeOptions, batch)
          batch.clear()
          bytes = 0
        }
      }
      if (batch.count > 0) db.write(writeOptions, batch)
    } finally batch.close()
  }

  /** Tests: runs in the background thread before it writes a frozen buffer (to widen the window). */
  @volatile private[keyedstate] var beforeBackgroundWriteForTest: () => Unit = null

  /** Tests: the next writes of buffered writes into RocksDB fail with this, as a full disk would. */
  @volatile private[keyedstate] var spillFault: Throwable = null

  /**
   * Key-ordered entries with `lower <= key < upper`. The iterator closes its native resources
   * when exhausted or through `close()`.
   */
  def scan(
      cf: String,
      lower: Option[Array[Byte]],
      upper: Option[Array[Byte]]): ClosableIterator[(Array[Byte], Array[Byte])] = {
    val readOptions = new ReadOptions()
    val upperSlice = upper.map(new Slice(_))
    upperSlice.foreach(readOptions.setIterateUpperBound)
    val (it, family) = usingFamily(cf, "scan") { family =>
      val it = currentFor(cf).newIterator(family.handle, readOptions)
      openIterators.put(it, family)
      lower match {
        case Some(l) => it.seek(l)
        case None => it.seekToFirst()
      }
      (it, family)
    }
    new Entries(it, family, prefix = null, release = () => {
      closeIterator(it)
      readOptions.close()
      upperSlice.foreach(_.close())
    })
  }

  /**
   * The entries of a sought iterator, up to its bound or, with a `prefix`, the first key without
   * it; `release` runs once, when they end or on `close()`.
   */
  private final class Entries(it: RocksIterator, family: GuardedHandle, prefix: Array[Byte], release: () => Unit)
    extends ClosableIterator[(Array[Byte], Array[Byte])] {
    private var done = false
    private var key: Array[Byte] = _ // the next entry's, read by hasNext
    def close(): Unit = if (!done) { done = true; release() }
    // Each step holds the family the iterator reads (not the scan: a scan left open must not stop
    // a drop or a close); a step after either fails before it touches the iterator.
    def hasNext: Boolean = {
      if (done) return false
      if (key != null) return true
      val found = holding(family, "scan") {
        if (it.isValid) {
          val k = it.key()
          if (prefix == null || KeyBytes.startsWith(k, prefix)) { key = k; true } else false
        } else { it.status(); false }
      }
      if (!found) close()
      found
    }
    def next(): (Array[Byte], Array[Byte]) = {
      if (!hasNext) throw new NoSuchElementException
      val kv = holding(family, "scan") {
        val v = (key, it.value())
        it.next()
        v
      }
      key = null
      kv
    }
  }

  /** Whether the family stores no entry at all (an expired one counts: it is stored). */
  def isEmpty(cf: String): Boolean = {
    // Buffered writes count as entries (deletes too): the buffer is not written in for this.
    bufferedEntries(_.entriesOf(cf)) == 0 && using(cf, "isEmpty") { h =>
      val it = db.newIterator(h)
      try {
        it.seekToFirst()
        if (!it.isValid) localIo(it.status()) // an I/O error ends an iterator too: it is thrown, not read as empty
        !it.isValid
      } finally it.close()
    }
  }

  /** Key-ordered entries whose key starts with `prefix`. */
  def prefixScan(cf: String, prefix: Array[Byte]): ClosableIterator[(Array[Byte], Array[Byte])] = {
    val reused = acquireScanIterator(cf, prefix)
    if (reused == null) return scan(cf, Some(prefix), KeyBytes.prefixUpperBound(prefix))
    new Entries(reused.it, reused.family, prefix, release = () => prefixIterators.synchronized {
      reused.inUse = false
      if (reused.retired) reused.close()
    })
  }

  /** The family's reusable iterator, current, sought to `prefix` and now in use; null if it is in use already. */
  private def acquireScanIterator(cf: String, prefix: Array[Byte]): ReusedIterator = usingFamily(cf, "prefixScan") { f =>
    val db = currentFor(cf) // before the monitor: its wait for a background write must not hold it
    val reused = prefixIterators.synchronized(reusedIterator(cf, f, db))
    if (reused != null) reused.it.seek(prefix)
    reused
  }

  private def reusedIterator(cf: String, family: GuardedHandle, db: RocksDB): ReusedIterator = {
    prefixIterators.get(cf) match {
      case Some(r) if r.family ne family => // a dropped family's of the same name (its drop closes it)
        prefixIterators.remove(cf)
        reusedIterator(cf, family, db)
      case Some(r) if r.inUse => null
      case Some(r) =>
        val (sequence, ingested) = (db.getLatestSequenceNumber, ingests)
        if (r.atSequence != sequence || r.atIngests != ingested) {
          localIo(r.it.refresh())
          r.atSequence = sequence
          r.atIngests = ingested
        }
        r.inUse = true
        r
      case None =>
        val (sequence, ingested) = (db.getLatestSequenceNumber, ingests) // read first: a write after it refreshes
        val it = db.newIterator(family.handle)
        openIterators.put(it, family)
        val r = new ReusedIterator(it, family, sequence, ingested)
        r.inUse = true
        prefixIterators(cf) = r
        r
    }
  }

  private def releaseScanIterator(cf: String): Unit = prefixIterators.synchronized {
    prefixIterators.remove(cf).foreach(r => if (r.inUse) r.retired = true else r.close())
  }

  /** Closes the iterators prefix scans keep (they pin memtables and SST files): a store's end. */
  def releaseScanIterators(): Unit = prefixIterators.synchronized {
    prefixIterators.keys.toList.foreach(releaseScanIterator)
  }

  private def withIterator[T](h: ColumnFamilyHandle)(f: RocksIterator => T): T = {
    val it = current.newIterator(h)
    try f(it) finally it.close()
  }

  /** Writes every buffered write into RocksDB and flushes every column family's memtable to SST files. */
  def flush(): Unit = {
    written(None, asFiles = true)
    usingAll("flush")(flushAll(_, waitForFlush = true))
  }

  /**
   * Flushes the memtables of `families`; without `waitForFlush` it returns at once: the memtables
   * become immutable, new writes go to fresh ones, and RocksDB's background threads write the
   * SSTs (a later waiting flush waits for these too).
   */
  private def flushAll(families: List[ColumnFamilyHandle], waitForFlush: Boolean): Boolean = {
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

  /** Tests: changes a family's mutable options, to bring RocksDB into states such as stopped writes. */
  private[keyedstate] def setOptionsForTest(cf: String, options: MutableColumnFamilyOptions): Unit =
    using(cf, "setOptions")(db.setOptions(_, options))

  /** A native checkpoint (hard links of the SSTs plus copies of the small files) in `target`. */
  def checkpoint(target: File): Unit = usingDb("checkpoint") {
    val cp = Checkpoint.create(current)
    try localIo(cp.createCheckpoint(target.getAbsolutePath)) finally cp.close()
  }

  /** Entries not in SST files: keys in the heap's buffers, writes in the memtables. */
  def unflushedEntries: Long = bufferedEntries(_.entries) +
    sumOfProperties("rocksdb.num-entries-active-mem-table", "rocksdb.num-entries-imm-mem-tables")

  /** RocksDB's estimate, plus the keys buffered in the heap (some may be in RocksDB too). */
  def estimateNumKeys(cf: String): Long =
    using(cf, "estimateNumKeys")(db.getLongProperty(_, "rocksdb.estimate-num-keys")) + bufferedEntries(_.entriesOf(cf))

  /** The heap's buffers, memtables and table readers (index and filter blocks outside the shared block cache). */
  def memoryUsageBytes: Long = bufferedEntries(_.heapBytes) +
    sumOfProperties("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem")

  /** The heap bytes this instance's write buffers hold, live and frozen (tests of the bound). */
  private[keyedstate] def heapBufferedBytes: Long = bufferedEntries(_.heapBytes)

  /** `count` of the buffer plus that of the frozen one. */
  private def bufferedEntries(count: WriteBuffer => Long): Long =
    lock.synchronized(count(buffer)) + Option(frozen).map(count).getOrElse(0L)

  def totalSstFilesBytes: Long = sumOfProperties("rocksdb.total-sst-files-size")

  /** RocksDB's integer `properties`, summed over every column family. */
  private def sumOfProperties(properties: String*): Long = usingAll("read properties") { handles =>
    handles.iterator.map(h => properties.iterator.map(db.getLongProperty(h, _)).sum).sum
  }

  def compactRange(): Unit = usingAll("compact")(_.foreach(h => localIo(current.compactRange(h))))

  /**
   * Adds SST files written by [[SstWriter]] to a column family in one step, moving (not copying)
   * them into the database. The files may overlap each other; their keys must be new.
   */
  def ingest(cf: String, files: Seq[File]): Unit = if (files.nonEmpty) using(cf, "ingest") { h =>
    written(None)
    ingestFiles(h, files)
  }

  /** Moves `files` into the family; RocksDB holds everything written before them. */
  private def ingestFiles(h: ColumnFamilyHandle, files: Seq[File]): Unit = {
    val opts = new IngestExternalFileOptions().setMoveFiles(true).setAllowGlobalSeqNo(true)
    try localIo(db.ingestExternalFile(h, files.map(_.getAbsolutePath).asJava, opts))
    finally opts.close()
    ingests += 1 // a file may keep sequence number 0: reused scan iterators must not trust the sequence alone
  }

  /**
   * Compacts the keys from `begin` to `end` (both included) of one column family down to the last
   * level, the last level included, so deleted values and their tombstones leave the SST files.
   */
  def compactRange(cf: String, begin: Array[Byte], end: Array[Byte]): Unit = {
    val opts = new CompactRangeOptions()
      .setBottommostLevelCompaction(CompactRangeOptions.BottommostLevelCompaction.kForceOptimized)
    try using(cf, "compactRange")(h => localIo(current.compactRange(h, begin, end, opts))) finally opts.close()
  }

  override def close(): Unit = if (closing.compareAndSet(false, true)) {
    // Operations in flight in other threads (a lookup, a maintenance scan) end first; later ones fail.
    val handles = lock.synchronized { val all = families; families = Map.empty; all.values.toList }
    handles.foreach(_.retire())
    // Writes still buffered belong to versions that are lost with the instance or were never
    // committed. The background write (it holds no handle) may not be stopped half-way: it runs
    // into the database.
    LocalRocksDB.awaitUninterruptibly(frozenSpill)
    prefixIterators.synchronized(prefixIterators.clear())
    openIterators.keySet.asScala.toList.foreach(closeIterator)
    lock.synchronized(buffer.release())
    Option(frozen).foreach(_.release())
    writeOptions.close()
    handles.foreach(_.handle.close())
    db.close()
    dbOptions.close()
    cfOptions.close()
    Option(spillDir.listFiles).foreach(_.foreach(_.delete())) // a spill's file, if it failed
    spillDir.delete()
  }
}

object LocalRocksDB {
  val DefaultColumnFamily = "default"

  private val logger = org.slf4j.LoggerFactory.getLogger(classOf[LocalRocksDB])

  // A batch of buffered writes going into RocksDB: large enough that the per-write cost (the
  // write path's queue and lock) is spread thin (a batch of 256 costs a put within 3% of one of
  // 4,096), small enough not to hold much native memory.
  private val BatchOps = 4096
  private val BatchBytes = 4L * 1024 * 1024

  /** `heapWriteBufferMB`, at most an eighth of the JVM's heap (a small executor's default stays safe). */
  private def heapBufferBytes(conf: KeyedStateConf): Long =
    math.min(conf.heapWriteBufferMB * 1024 * 1024, Runtime.getRuntime.maxMemory / 8)

  /** Bytes the write buffers of every instance in this JVM hold (tests). */
  private[keyedstate] def bufferedBytesInJvm: Long = WriteBuffer.executorTotal

  /** What [[LocalRocksDB.get]]'s look in the buffer returns for a key the buffer does not hold. */
  private val NotBuffered = new Array[Byte](0)

  // Writes frozen buffers into RocksDB, for every instance in the JVM: a write of one is about a
  // tenth of a second of one core per 100,000 keys, once per snapshot interval. Up to as many
  // threads as tasks can freeze at once (one per core; at least 2); an idle one ends after a minute.
  private val spillThreads = {
    val threads = math.max(2, Runtime.getRuntime.availableProcessors)
    val pool = new java.util.concurrent.ThreadPoolExecutor(threads, threads, 60L, java.util.concurrent.TimeUnit.SECONDS,
      new java.util.concurrent.LinkedBlockingQueue[Runnable](), (r: Runnable) => {
        val t = new Thread(r, "keyedstate-buffer-spill")
        t.setDaemon(true)
        t
      })
    pool.allowCoreThreadTimeOut(true)
    pool
  }

  /** Waits for `task` (if any) to end, however it ends, even if this thread is interrupted meanwhile. */
  private def awaitUninterruptibly(task: java.util.concurrent.Future[_]): Unit = if (task != null) {
    var interrupted = false
    var done = false
    while (!done) {
      try { task.get(); done = true }
      catch {
        case _: InterruptedException => interrupted = true
        case _: java.util.concurrent.ExecutionException | _: java.util.concurrent.CancellationException => done = true
      }
    }
    if (interrupted) Thread.currentThread().interrupt()
  }

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
    new LocalRocksDB(dir, db, dbOptions, cfOptions, handles.asScala.toSeq, heapBufferBytes(conf))
  }
}
