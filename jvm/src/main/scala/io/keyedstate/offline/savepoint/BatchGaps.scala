package io.keyedstate.offline.savepoint

import io.keyedstate.offline.QueryCheckpoint

/**
 * A savepoint of a running query yields to the query's batches: before each unit of its work (one
 * store partition's copy, one table's write) it waits for a gap between two batches, seen in the
 * query's logs, so the work and a batch share the machine's cores as little as possible. A batch
 * is in progress while its `offsets` file has no `commits` file: the signal every trigger sees (in
 * the query's application, the CLI's, another machine's). In the query's own application the
 * query's trigger is watched too (`triggerActive`), as it also covers the trigger's start: the
 * source's listing and planning before the offsets are written.
 *
 * A query that runs batches back to back is waited for up to one batch per unit (at most
 * `maxWaitMs`), so the savepoint still progresses. A batch that has not committed after
 * `maxWaitMs` (a query that stopped mid-batch, a very long batch) ends the yielding for the
 * rest of the savepoint. A stopped checkpoint is never waited for.
 */
final class BatchGaps(ckpt: QueryCheckpoint, committed: Long, triggerActive: () => Boolean = () => false,
    maxWaitMs: Long = BatchGaps.MaxWaitMs, pollMs: Long = BatchGaps.PollMs, progress: String => Unit = _ => ()) {
  private var lastCommitted = committed
  private var yielding = true
  private var waitedNs = 0L
  // Until then the logs were seen idle and are not looked at again (nanoTime, compared by difference).
  private var logsIdleUntilNs = System.nanoTime()

  /** How long the units of work have waited in all; for the savepoint's report. */
  def totalWaitMs: Long = synchronized(waitedNs / 1000000)

  /**
   * Returns once no batch of the query is in progress, or when waiting longer makes no sense. Cheap
   * enough to call before every file: the logs are looked at once per `pollMs` at most.
   */
  def await(): Unit = synchronized {
    if (yielding) {
      val began = System.nanoTime()
      var running = inProgress(began)
      while (running.isDefined && yielding) {
        if (System.nanoTime() - began >= maxWaitMs * 1000000) {
          yielding = false
          progress(s"batch ${running.get} of ${ckpt.root} has not committed in $maxWaitMs ms: the savepoint " +
            "stops waiting for gaps between batches")
        } else {
          Thread.sleep(pollMs)
          running = inProgress(System.nanoTime())
        }
      }
      waitedNs += System.nanoTime() - began
    }
  }

  /**
   * The batch in progress: the first batch after the last committed one, from the start of its
   * trigger in the query's own application, or once it has offsets and no commit.
   */
  private def inProgress(now: Long): Option[Long] = {
    if (triggerActive()) Some(lastCommitted + 1)
    else if (now - logsIdleUntilNs < 0) None
    else {
      while (ckpt.fs.exists(ckpt.commitPath(lastCommitted + 1))) lastCommitted += 1
      val running = Some(lastCommitted + 1).filter(b => ckpt.fs.exists(ckpt.offsetPath(b)))
      if (running.isEmpty) logsIdleUntilNs = now + pollMs * 1000000
      running
    }
  }
}

object BatchGaps {
  /** The longest wait for one batch: longer than a typical micro-batch, short enough to progress. */
  val MaxWaitMs = 10000L

  /** How often the logs are looked at (two file-status calls) before a file, or while a batch runs. */
  val PollMs = 10L
}
