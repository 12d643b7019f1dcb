package io.keyedstate.rocks

/**
 * Tests only: pauses and faults a test injects into one [[LocalRocksDB]]'s write path
 * ([[BufferedWrites]]), to widen a race's window or fail as a full disk would. Production code
 * never sets them; unset, each costs one volatile read.
 */
private[keyedstate] final class TestHooks {
  /** Runs before a point read goes into RocksDB, its family's handle held. */
  @volatile var beforeNativeRead: () => Unit = null

  /** Runs in the background thread before it writes a frozen buffer (to widen the window). */
  @volatile var beforeBackgroundWrite: () => Unit = null

  /** The next writes of buffered writes into RocksDB fail with this, as a full disk would. */
  @volatile var spillFault: Throwable = null
}
