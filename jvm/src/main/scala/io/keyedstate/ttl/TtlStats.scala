package io.keyedstate.ttl

/** How a stored entry (or element of a multi-value entry) left the state. */
sealed abstract class CleanupStrategy(val name: String)
object CleanupStrategy {
  case object FullSnapshot extends CleanupStrategy("fullSnapshot")
  case object Incremental extends CleanupStrategy("incremental")
  case object Compaction extends CleanupStrategy("compaction")
  case object Background extends CleanupStrategy("background")
}

/**
 * TTL activity of one version (from the store's open to its commit): expired entries that
 * reads and scans hid, and entries each cleanup strategy removed. Entries of multi-value
 * column families count per element.
 */
final case class TtlStats(
    expiredHidden: Long = 0,
    removedFullSnapshot: Long = 0,
    removedIncremental: Long = 0,
    removedCompaction: Long = 0,
    removedBackground: Long = 0) {
  def removed(s: CleanupStrategy, n: Long): TtlStats = s match {
    case CleanupStrategy.FullSnapshot => copy(removedFullSnapshot = removedFullSnapshot + n)
    case CleanupStrategy.Incremental => copy(removedIncremental = removedIncremental + n)
    case CleanupStrategy.Compaction => copy(removedCompaction = removedCompaction + n)
    case CleanupStrategy.Background => copy(removedBackground = removedBackground + n)
  }
}
