package io.keyedstate.rocks

import java.nio.charset.StandardCharsets.UTF_8
import java.util.concurrent.atomic.AtomicBoolean

import org.rocksdb.ColumnFamilyHandle

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * The column families of one [[LocalRocksDB]] by name, each a [[GuardedHandle]]: their one owner.
 * Every operation holds the handles it uses ([[using]]); what reads or writes the database as a
 * whole holds the default family's, which only the close retires. A drop or the close retires a
 * handle (new users fail, those in flight are waited for) before it is closed.
 *
 * The map is immutable, replaced under `lock` when the task thread creates or drops a family or
 * another thread closes the instance, and read without a lock by every thread. `lock` is the
 * write buffer's ([[BufferedWrites]]): its writes and its freeze find the map unchanged while
 * they hold it.
 */
private[rocks] final class FamilyHandles(native: NativeDb, initialHandles: Seq[ColumnFamilyHandle], lock: AnyRef) {
  @volatile private var families: Map[String, GuardedHandle] =
    initialHandles.map { h => val name = new String(h.getName, UTF_8); name -> new GuardedHandle(name, h) }.toMap
  @volatile private var lastUsed: GuardedHandle = _ // the family of the last operation: usually the next one's
  private val closing = new AtomicBoolean(false)
  private var retired: List[GuardedHandle] = Nil // by the close, closed last

  private def dir = native.dir

  def names: Set[String] = families.keySet
  def contains(name: String): Boolean = families.contains(name)
  def get(name: String): Option[GuardedHandle] = families.get(name)

  /** Every family's handle, not held (the caller holds `lock` or the default family's handle). */
  def handles: List[ColumnFamilyHandle] = families.values.map(_.handle).toList

  /** `name`'s handle, not held (the caller holds `lock`, the family has buffered writes). */
  def handle(name: String): ColumnFamilyHandle = families(name).handle

  /** `body` with `cf`'s handle, held: a drop or a close waits until it returns. */
  def using[T](cf: String, op: String)(body: ColumnFamilyHandle => T): T = usingFamily(cf, op)(f => body(f.handle))

  def usingFamily[T](cf: String, op: String)(body: GuardedHandle => T): T = {
    val family = acquire(cf, op)
    try body(family) finally family.release()
  }

  /** `body` with `family` held, if it is still in use; what is left of a dropped or closed one fails. */
  def holding[T](family: GuardedHandle, op: String)(body: => T): T = {
    if (!family.tryAcquire()) {
      if (closing.get()) throw closedError(op)
      throw KeyedStateErrors.badState(ErrorId.UnsupportedOperation,
        s"Cannot $op: column family '${family.name}' of RocksDB at $dir was dropped")
    }
    try body finally family.release()
  }

  /** `body` while the database stays open (the default family's handle held). */
  def usingDb[T](op: String)(body: => T): T = using(LocalRocksDB.DefaultColumnFamily, op)(_ => body)

  /** `body` with the handles of every family (those being dropped left out), the database held open. */
  def usingAll[T](op: String)(body: List[ColumnFamilyHandle] => T): T = usingDb(op) {
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

  /** Creates the family unless it exists. */
  def create(name: String): Unit = lock.synchronized {
    if (!families.contains(name)) {
      val h = native.createColumnFamily(name)
      families += name -> new GuardedHandle(name, h)
    }
  }

  /** Takes the family out of the map: new calls no longer find it (those in flight still hold it). */
  def remove(name: String): Unit = lock.synchronized(families -= name)

  /** Drops a removed and retired family from RocksDB and closes its handle. */
  def dropNative(family: GuardedHandle): Unit = {
    native.localIo(native.db.dropColumnFamily(family.handle))
    family.handle.close()
  }

  /** Whether the instance's close has begun. */
  def isClosing: Boolean = closing.get()

  /**
   * The close's first step, once (false if it was taken already): every family leaves the map,
   * the calls in flight in other threads end first, later ones fail as closed.
   */
  def retireAll(): Boolean = closing.compareAndSet(false, true) && {
    val handles = lock.synchronized { val all = families; families = Map.empty; all.values.toList }
    retired = handles
    handles.foreach(_.retire())
    true
  }

  /** Closes the handles [[retireAll]] retired (before the database: see `NativeDb.close`). */
  def closeRetired(): Unit = retired.foreach(_.handle.close())
}
