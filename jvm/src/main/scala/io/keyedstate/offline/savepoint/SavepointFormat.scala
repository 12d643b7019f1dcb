package io.keyedstate.offline.savepoint

import io.keyedstate.offline.{QueryCheckpoint, SavepointFile, SavepointMetadata, SavepointOperator}

/**
 * How a savepoint holds the state (docs/savepoints.md): one strategy per format behind one
 * interface, as Flink's snapshot strategies are. [[Savepoints]] does what every format shares
 * (the target, the query's logs, `_savepoint.json`, verification, restore's target and cleanup).
 */
trait SavepointFormat {
  /** The format's name in `_savepoint.json`. */
  def name: String

  /** Refuses, before anything is written, a checkpoint this format cannot take. */
  def check(src: QueryCheckpoint, batch: Long): Unit

  /**
   * Writes the state of `src` at committed `batch` into `dst`: its operators and files; each unit
   * of work waits for a gap between the batches of the query that may be running on `src`.
   */
  def write(src: QueryCheckpoint, dst: QueryCheckpoint, batch: Long, partitions: Int,
      usesCheckpointIds: Boolean, gaps: BatchGaps): (Seq[SavepointOperator], Seq[SavepointFile])

  /**
   * Writes a new checkpoint at `dst` from the savepoint `sp` (already verified), at `partitions`,
   * its state for `provider` when given; the bytes written.
   */
  def restore(sp: QueryCheckpoint, metadata: SavepointMetadata, dst: QueryCheckpoint, partitions: Int,
      provider: Option[String]): Long
}
