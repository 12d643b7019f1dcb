package io.keyedstate.rocks

import java.io.File
import java.util.concurrent.{CancellationException, ExecutionException, Future, FutureTask}

import org.rocksdb._

/**
 * The writes of one [[LocalRocksDB]] waiting in the heap, and the point reads that look through
 * them to RocksDB.
 *
 * Writes wait in the heap, as RocksDB's own memtables would hold them but without their cost:
 * a put is a hash insert, a read of a key written since is a hash lookup, and RocksDB's
 * memtables stay empty, so every other read skips them. The commit before a snapshot freezes
 * the buffer and a background thread writes it into RocksDB in key order and flushes
 * ([[flushInBackground]]); reads look in the buffer, then the frozen one, then RocksDB. What
 * reads the database as a whole (scans, flushes, checkpoints) writes the buffer in first
 * ([[written]]). Over the executor-wide bound (`heapWriteBufferMB`, every store's buffers), a
 * store's writes go into RocksDB directly (see [[write]]).
 *
 * `lock` guards the buffer: with Spark's pipelined Python runner a keyed function's lookups read
 * in another thread than the one that writes, and the maintenance thread scans. The family map
 * changes under it too ([[FamilyHandles]]).
 */
private[rocks] final class BufferedWrites(
    native: NativeDb,
    families: FamilyHandles,
    lock: AnyRef,
    heapBufferBytes: Long,
    hooks: TestHooks) {
  import native.{db, localIo, writeOptions}

  private var buffer = new WriteBuffer
  // The previous buffer, read-only from the moment it is frozen; null once RocksDB holds it.
  @volatile private var frozen: WriteBuffer = null
  @volatile private var frozenSpill: Future[_] = null
  // The failure of writing buffered writes into RocksDB (a full disk): some of them are lost (or,
  // for merges, may be applied twice), so every later read, write and commit fails with it,
  // whichever thread met it first, and the provider rebuilds the instance.
  @volatile private var lostWrites: Throwable = null

  /** Throws the failure that lost buffered writes, if any: a commit must not record them. */
  def throwIfWritesLost(): Unit = if (lostWrites != null) throw lostWrites

  /** Whether no buffered write was lost (a failed instance must be rebuilt, not reused). */
  def healthy: Boolean = lostWrites == null

  /** The database with every write made so far in it: what scans and file operations use. */
  def current: RocksDB = written(None)

  /** The database with every write made so far to `cf` in it. */
  def currentFor(cf: String): RocksDB = written(Some(cf))

  /** The database once the buffered writes of `only` that family (or of all) are in it; see [[spill]]. */
  def written(only: Option[String], asFiles: Boolean = false): RocksDB = {
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

  private def beforeNativeRead(): Unit = { val hook = hooks.beforeNativeRead; if (hook != null) hook() }

  /** The value of `key` in `cf` (whose handle `h` the caller holds), or null. */
  def get(h: ColumnFamilyHandle, cf: String, key: Array[Byte]): Array[Byte] = {
    val buffered = lock.synchronized {
      throwIfWritesLost()
      val t = buffer.tableOrNull(cf)
      val i = if (t == null) -1 else t.find(key)
      if (i < 0) BufferedWrites.NotBuffered
      else t.kind(i) match {
        case WriteTable.Put => t.value(i)
        case WriteTable.Delete => null
        // Under the lock: no spill moves these operands into RocksDB before the base is read.
        case _ => KeyBytes.appended(getBelowBuffer(h, cf, key), t.value(i))
      }
    }
    if (buffered ne BufferedWrites.NotBuffered) buffered else getBelowBuffer(h, cf, key)
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

  /** Whether `key` exists in `cf` (whose handle `h` the caller holds), its value not copied out. */
  def exists(h: ColumnFamilyHandle, cf: String, key: Array[Byte]): Boolean = {
    val kind = lock.synchronized { throwIfWritesLost(); buffer.kindOf(cf, key) }
    if (kind != WriteBuffer.Missing) kind != WriteTable.Delete
    else {
      val f = frozen
      val below = if (f == null) WriteBuffer.Missing else f.kindOf(cf, key)
      if (below != WriteBuffer.Missing) below != WriteTable.Delete
      else { beforeNativeRead(); PointReads.exists(db, h, key) }
    }
  }

  /** A put, merge or delete ([[WriteTable.Put]], ...): into the buffer, or over the bound into RocksDB. */
  def write(kind: Byte, cf: String, key: Array[Byte], value: Array[Byte]): Unit = {
    val overBound = WriteBuffer.overBound(heapBufferBytes)
    // Over the bound, RocksDB must hold the frozen writes before newer ones go in directly (they
    // go in as files, newer than the memtables). Waited for without the lock: reads go on meanwhile.
    if (overBound) awaitFrozenSpill()
    lock.synchronized {
      throwIfWritesLost()
      if (!families.contains(cf)) families.using(cf, "write")(_ => ()) // names the missing family, or the closed instance
      if (overBound) {
        // The executor's buffers hold the bound: this store's go into RocksDB, and the write too.
        spill(buffer.columnFamilies.toList)
        families.using(cf, "write")(h => localIo(kind match {
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
   * Drops the family's waiting writes (the family is dropped); the frozen ones are in RocksDB first
   * (their background write uses the handle), so a family created again under the name starts
   * with nothing buffered.
   */
  def dropFamily(cf: String): Unit = lockedAfterFrozenSpill(buffer.remove(cf))

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
        families.using(cf, "write buffered writes")(h => keepingFailure(if (asFiles) ingestInto(h, t) else writeInto(h, t)))
        buffer.remove(cf)
      }
    }
  }

  /**
   * Freezes the buffer and writes it into RocksDB in the background, then starts flushing the
   * memtables: the commit before a snapshot, so the snapshot's own flush holds one batch (see
   * VersionLineage). Reads meanwhile look in the frozen buffer; anything that needs RocksDB to
   * hold every write waits for the background write first. False when nothing was started
   * (RocksDB refused the flush: writes stopped). The previous frozen buffer goes in first.
   */
  def flushInBackground(): Boolean = lockedAfterFrozenSpill(freeze())

  private def freeze(): Boolean = {
    // The background write holds no handle: a drop and the close wait for it before theirs go.
    val toFlush = families.handles
    if (buffer.isEmpty) native.flush(toFlush, waitForFlush = false)
    else {
      val f = buffer
      val tables = f.columnFamilies.toList.map(cf => (families.handle(cf), f.tableOrNull(cf)))
      val task = new FutureTask[Unit](() => {
        Option(hooks.beforeBackgroundWrite).foreach(_())
        keepingFailure {
          tables.foreach { case (h, t) => ingestInto(h, t) }
          native.flush(toFlush, waitForFlush = false) // what scans and the bound wrote into the memtables
        }
        frozen = null // RocksDB holds it all now (after a failure reads keep using it: see lostWrites)
        f.release()
      })
      // The task is known before the frozen buffer is: a reader that finds a merge in it waits for it.
      frozenSpill = task
      buffer = new WriteBuffer
      frozen = f
      BufferedWrites.spillThreads.execute(task)
      true
    }
  }

  /** Waits until the frozen buffer, if any, is in RocksDB; throws if its writes were lost. */
  private def awaitFrozenSpill(): Unit = {
    val s = frozenSpill
    if (s != null) {
      try s.get() catch { case _: ExecutionException => } // recorded in lostWrites
      lock.synchronized { if (frozenSpill eq s) frozenSpill = null } // not a newer one, frozen meanwhile
    }
    throwIfWritesLost()
  }

  /** Runs `body`; a failure is kept in `lostWrites` (unless one is kept already) and thrown. */
  private def keepingFailure(body: => Unit): Unit =
    try {
      val fault = hooks.spillFault
      if (fault != null) throw fault
      body
    } catch {
      case e: Throwable =>
        if (lostWrites == null) lostWrites = e match {
          case r: RocksDBException => RocksDBResources.failure(native.dir, r)
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
    val writer = new SstWriter(new File(spillDir, s"${java.util.UUID.randomUUID()}.sst"), native.sstFileOptions())
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
      native.ingest(h, Seq(writer.file))
    } finally {
      writer.close()
      writer.file.delete() // moved into the database unless the ingest failed
    }
  }

  // Where frozen tables' SST files are written before RocksDB takes them: beside the database.
  private def spillDir: File = new File(native.dir.getParentFile, native.dir.getName + ".spill")

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
        if (batch.count >= BufferedWrites.BatchOps || bytes >= BufferedWrites.BatchBytes) {
          db.write(writeOptions, batch)
          batch.clear()
          bytes = 0
        }
      }
      if (batch.count > 0) db.write(writeOptions, batch)
    } finally batch.close()
  }

  /** `count` of the buffer plus that of the frozen one. */
  def entries(count: WriteBuffer => Long): Long =
    lock.synchronized(count(buffer)) + Option(frozen).map(count).getOrElse(0L)

  /**
   * The close's wait for the background write (it holds no handle), which may not be stopped
   * half-way: it runs into the database.
   */
  def awaitBackgroundWrite(): Unit = BufferedWrites.awaitUninterruptibly(frozenSpill)

  /**
   * The close's release of what is still buffered: writes of versions that are lost with the
   * instance or were never committed. They leave the executor-wide total.
   */
  def release(): Unit = {
    lock.synchronized(buffer.release())
    Option(frozen).foreach(_.release())
  }

  /** Removes the spill's directory (and a failed spill's file) once the database is closed. */
  def deleteSpillDir(): Unit = {
    Option(spillDir.listFiles).foreach(_.foreach(_.delete()))
    spillDir.delete()
  }
}

private[rocks] object BufferedWrites {
  // A batch of buffered writes going into RocksDB: large enough that the per-write cost (the
  // write path's queue and lock) is spread thin (a batch of 256 costs a put within 3% of one of
  // 4,096), small enough not to hold much native memory.
  private val BatchOps = 4096
  private val BatchBytes = 4L * 1024 * 1024

  /** What [[BufferedWrites.get]]'s look in the buffer returns for a key the buffer does not hold. */
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
  private def awaitUninterruptibly(task: Future[_]): Unit = if (task != null) {
    var interrupted = false
    var done = false
    while (!done) {
      try { task.get(); done = true }
      catch {
        case _: InterruptedException => interrupted = true
        case _: ExecutionException | _: CancellationException => done = true
      }
    }
    if (interrupted) Thread.currentThread().interrupt()
  }
}
