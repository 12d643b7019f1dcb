package io.keyedstate.rocks

import java.util.concurrent.atomic.{AtomicBoolean, AtomicInteger}
import java.util.concurrent.locks.LockSupport

import org.rocksdb.ColumnFamilyHandle

/**
 * A column family's native handle and the operations using it. The family's drop, or the
 * instance's close, retires it: new users are refused at once and those in flight are waited
 * for, and only then is the handle closed. Several threads use an instance (the task thread
 * writes, a keyed function's lookup thread reads, maintenance scans, listeners abort and close),
 * so a use after close must be an exception, never a native use after free.
 */
private[rocks] final class GuardedHandle(val name: String, val handle: ColumnFamilyHandle) {
  // The users in flight; once retired, Int.MinValue plus them (negative: acquiring fails).
  private val users = new AtomicInteger()
  private val retiring = new AtomicBoolean()

  /** Counts one more user, unless the handle is retired. */
  def tryAcquire(): Boolean = users.incrementAndGet() > 0 || { users.decrementAndGet(); false }

  def release(): Unit = users.decrementAndGet()

  /**
   * Refuses new users, then waits until none is left (the caller must not be one of them). Calls
   * are short, but a read may wait seconds for a frozen buffer's write: the wait backs off from
   * 20 µs to 1 ms between looks.
   */
  def retire(): Unit = {
    if (retiring.compareAndSet(false, true)) users.addAndGet(Int.MinValue)
    var pause = 20000L
    while (users.get() != Int.MinValue) {
      LockSupport.parkNanos(pause)
      pause = math.min(pause * 2, 1000000L)
    }
  }
}
