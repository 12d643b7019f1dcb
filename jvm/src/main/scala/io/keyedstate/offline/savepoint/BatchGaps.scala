package io.keyedstate.offline.savepoint

import io.keyedstate.offline.QueryCheckpoint

/**
 * A savepoint of a running query yields to the query's batches: before each unit of its work (a
 * native savepoint's file, a canonical savepoint's table) it waits for a gap between two batches,
 * so the work and a batch share the machine's cores as little as possible. A batch is in progress
 * while its `offsets` file has no `commits` file: the signal every trigger sees (in the query's
 * application, the CLI's, another machine's). In the query's own application the query's trigger
 * is watched too (`triggerActive`), as it also covers the trigger's start: the source's listing
 * and planning before the offsets are written.
 *
 * A unit waits for one batch at most: once the batch it found running has committed it goes on,
 * even if the next has started (a query that runs batches back to back still lets the savepoint
 * progress). A batch that has not committed after `maxWaitMs` (a very long batch, a query that
 * died mid-batch) ends the yielding for the rest of the savepoint. Offsets older than `maxWaitMs`
 * with no commit are a stopped query's planned batch, not waited for.
 */
final class BatchGaps(ckpt: QueryCheckpoint, committed: Long, triggerActive: () => Boolean = () => false,
    maxWaitMs: Long = BatchGaps.MaxWaitMs, progress: String => Unit = _ => ()) {
  private val pollMs = BatchGaps.pollMsFor(ckpt)
  private var lastCommitted = committed
  private var yielding = true
  private var waitedNs = 0L
  // Until then the logs were seen idle and are not looked at again (nanoTime, compared by difference).
  private var logsIdleUntilNs = System.nanoTime()
  // A batch planned long ago and never committed: a stopped query's, which no wait will see commit.
  private var stale = Option.empty[Long]

  /** How long the units of work have waited in all; for the savepoint's report. */
  def totalWaitMs: Long = synchronized(waitedNs / 1000000)

  /**
   * Returns once the batch in progress (if any) has committed, or when waiting longer makes no
   * sense. Cheap enough to call before every file: the logs are looked at once per `pollMs` at most.
   */
  def await(): Unit = synchronized {
    if (yielding) {
      val began = System.nanoTime()
      val waitedFor = inProgress(began)
      var running = waitedFor
      while (running.isDefined && running == waitedFor && yielding) {
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
    val active = triggerActive()
    if (!active && now - logsIdleUntilNs < 0) None
    else {
      while (ckpt.fs.exists(ckpt.commitPath(lastCommitted + 1))) lastCommitted += 1
      val next = lastCommitted + 1
      val running = if (active) Some(next) else Some(next).filter(b => !stale.contains(b) && planned(b))
      if (running.isEmpty) logsIdleUntilNs = now + pollMs * 1000000
      running
    }
  }

  /** Whether batch `b` has offsets written lately (older ones: a stopped query's, remembered as stale). */
  private def planned(b: Long): Boolean =
    try {
      val age = System.currentTimeMillis() - ckpt.fs.getFileStatus(ckpt.offsetPath(b)).getModificationTime
      if (age > maxWaitMs) stale = Some(b)
      age <= maxWaitMs
    } catch {
      case _: java.io.FileNotFoundException => false
    }
}

object BatchGaps {
  /** The longest wait for one batch: longer than a typical micro-batch, short enough to progress. */
  val MaxWaitMs = 10000L

  /**
   * How often the logs are looked at (two file-status calls) before a file, or while a batch runs:
   * often on a local disk, less on a remote file system, where each call is a request.
   */
  def pollMsFor(ckpt: QueryCheckpoint): Long = if (ckpt.fs.getScheme == "file") 10L else 100L
}
