package io.keyedstate.rocks

import java.util.concurrent.ConcurrentHashMap

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import org.rocksdb.{ReadOptions, RocksDB, RocksIterator, Slice}

/**
 * The native iterators of one [[LocalRocksDB]]'s scans: their one owner. Every open one is
 * tracked with the family it reads, so a drop closes its family's and the close all of them.
 *
 * Prefix scans reuse one iterator per column family: a native iterator, its ReadOptions and
 * its bound per scan cost as much as a short scan itself. An iterator sees the database as of
 * its creation, so a scan after any write (RocksDB's sequence number moved) or file ingest
 * refreshes it first; dropping the family closes it. A scan that starts while the family's
 * iterator is still in use opens its own. A kept iterator pins its memtables and SST files
 * until [[releaseAll]] (commit and release of a store).
 */
private[rocks] final class ScanIterators(native: NativeDb, families: FamilyHandles, buffered: BufferedWrites) {
  // Every native iterator open, with the family it reads.
  private val openIterators = new ConcurrentHashMap[RocksIterator, GuardedHandle]()

  private final class ReusedIterator(val it: RocksIterator, val family: GuardedHandle, var atSequence: Long,
      var atIngests: Long) {
    var inUse = false
    var retired = false // released while in use: closed when its scan ends
    def close(): Unit = closeIterator(it)
  }

  /** Closes an open native iterator, once (a drop or a close may have closed it already). */
  private def closeIterator(it: RocksIterator): Unit = if (openIterators.remove(it) != null) it.close()
  private val prefixIterators = mutable.HashMap[String, ReusedIterator]()

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
    val (it, family) = families.usingFamily(cf, "scan") { family =>
      val it = buffered.currentFor(cf).newIterator(family.handle, readOptions)
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

  /** Key-ordered entries whose key starts with `prefix`. */
  def prefixScan(cf: String, prefix: Array[Byte]): ClosableIterator[(Array[Byte], Array[Byte])] = {
    val reused = acquire(cf, prefix)
    if (reused == null) return scan(cf, Some(prefix), KeyBytes.prefixUpperBound(prefix))
    new Entries(reused.it, reused.family, prefix, release = () => prefixIterators.synchronized {
      reused.inUse = false
      if (reused.retired) reused.close()
    })
  }

  /** The family's reusable iterator, current, sought to `prefix` and now in use; null if it is in use already. */
  private def acquire(cf: String, prefix: Array[Byte]): ReusedIterator = families.usingFamily(cf, "prefixScan") { f =>
    val db = buffered.currentFor(cf) // before the monitor: its wait for a background write must not hold it
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
        val (sequence, ingested) = (db.getLatestSequenceNumber, native.ingests)
        if (r.atSequence != sequence || r.atIngests != ingested) {
          native.localIo(r.it.refresh())
          r.atSequence = sequence
          r.atIngests = ingested
        }
        r.inUse = true
        r
      case None =>
        val (sequence, ingested) = (db.getLatestSequenceNumber, native.ingests) // read first: a write after it refreshes
        val it = db.newIterator(family.handle)
        openIterators.put(it, family)
        val r = new ReusedIterator(it, family, sequence, ingested)
        r.inUse = true
        prefixIterators(cf) = r
        r
    }
  }

  /** Releases the family's reused iterator: closed now, or when the scan using it ends. */
  def release(cf: String): Unit = prefixIterators.synchronized {
    prefixIterators.remove(cf).foreach(r => if (r.inUse) r.retired = true else r.close())
  }

  /** Closes the iterators prefix scans keep (they pin memtables and SST files): a store's end. */
  def releaseAll(): Unit = prefixIterators.synchronized {
    prefixIterators.keys.toList.foreach(release)
  }

  /** The drop of `family` (retired, so no scan steps in it): its iterators go, scans left open included. */
  def closeFamily(family: GuardedHandle): Unit = {
    prefixIterators.synchronized {
      if (prefixIterators.get(family.name).exists(_.family eq family)) prefixIterators.remove(family.name)
    }
    openIterators.asScala.collect { case (it, f) if f eq family => it }.foreach(closeIterator)
  }

  /** The close (every family retired): every iterator goes. */
  def closeAll(): Unit = {
    prefixIterators.synchronized(prefixIterators.clear())
    openIterators.keySet.asScala.toList.foreach(closeIterator)
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
      val found = families.holding(family, "scan") {
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
      val kv = families.holding(family, "scan") {
        val v = (key, it.value())
        it.next()
        v
      }
      key = null
      kv
    }
  }
}
