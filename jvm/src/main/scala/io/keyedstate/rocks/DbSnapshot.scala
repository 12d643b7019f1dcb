package io.keyedstate.rocks

import java.util.concurrent.locks.ReentrantReadWriteLock

import scala.collection.mutable.ArrayBuffer

import org.rocksdb.{ReadOptions, Snapshot, Slice}

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * A point-in-time, read-only view of a [[LocalRocksDB]]: every write made before it was taken,
 * none after. Other threads read it while the instance's owner goes on writing (RocksDB's own
 * snapshot: a sequence number reads stop at). Its native snapshot and read options are owned
 * here; [[close]] waits for the reads in flight, and the instance's close closes every snapshot
 * still open first, so no read ever touches a released snapshot or a closed database.
 */
final class DbSnapshot private[rocks] (
    native: NativeDb,
    families: FamilyHandles,
    snapshot: Snapshot,
    onClose: DbSnapshot => Unit) extends AutoCloseable {

  private val readOptions = new ReadOptions().setSnapshot(snapshot)
  private val lock = new ReentrantReadWriteLock()
  private var closed = false

  private def reading[T](op: String)(body: => T): T = {
    lock.readLock().lock()
    try {
      if (closed) throw KeyedStateErrors.badState(ErrorId.StoreClosed,
        s"Cannot $op: the snapshot of RocksDB at ${native.dir} was released (a newer version replaced it, or the " +
          "instance was unloaded)")
      body
    } finally lock.readLock().unlock()
  }

  /** The value of `key` in `cf` when the snapshot was taken, or null. */
  def get(cf: String, key: Array[Byte]): Array[Byte] = reading("read a snapshot") {
    families.using(cf, "read a snapshot")(h => native.localIo(native.db.get(h, readOptions, key)))
  }

  /**
   * The entries of `cf` whose key starts with `prefix`, in key order, at most `limit` of them
   * (and whether more follow).
   */
  def prefixScan(cf: String, prefix: Array[Byte], limit: Int): (Seq[(Array[Byte], Array[Byte])], Boolean) =
    reading("scan a snapshot") {
      families.using(cf, "scan a snapshot") { h =>
        val options = new ReadOptions().setSnapshot(snapshot)
        val upper = KeyBytes.prefixUpperBound(prefix).map(new Slice(_))
        upper.foreach(options.setIterateUpperBound)
        val it = native.db.newIterator(h, options)
        try {
          val out = ArrayBuffer[(Array[Byte], Array[Byte])]()
          it.seek(prefix)
          while (it.isValid && out.length < limit && KeyBytes.startsWith(it.key(), prefix)) {
            out += it.key() -> it.value()
            it.next()
          }
          val more = it.isValid && KeyBytes.startsWith(it.key(), prefix)
          if (!it.isValid) native.localIo(it.status())
          (out.toSeq, more)
        } finally {
          it.close()
          options.close()
          upper.foreach(_.close())
        }
      }
    }

  /** Releases the snapshot once the reads in flight end; later reads fail. Idempotent. */
  override def close(): Unit = {
    lock.writeLock().lock()
    try if (!closed) {
      closed = true
      native.db.releaseSnapshot(snapshot)
      readOptions.close()
      onClose(this)
    } finally lock.writeLock().unlock()
  }
}
