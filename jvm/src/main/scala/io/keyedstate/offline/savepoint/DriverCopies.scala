package io.keyedstate.offline.savepoint

import java.util.concurrent.{ExecutionException, Executors, Future, TimeUnit}

import scala.util.control.NonFatal

/**
 * A native savepoint's copies of store partitions, on the driver: `threads` at a time, with
 * progress every few seconds. When one fails the others are interrupted and waited for before the
 * failure is thrown: they may still write files, and the caller's cleanup of the savepoint's
 * folder must come after them.
 */
private[savepoint] object DriverCopies {
  private val ProgressEveryMs = 2000L
  private val StopWaitMs = 120000L

  def run(tasks: Seq[StoreCopy], threads: Int, progress: String => Unit)(copy: StoreCopy => CopiedStore): Seq[CopiedStore] =
    if (tasks.isEmpty) Nil
    else {
      val pool = Executors.newFixedThreadPool(math.max(1, math.min(threads, tasks.size)), (r: Runnable) => {
        val t = new Thread(r, "keyedstate-savepoint-copy")
        t.setDaemon(true)
        t
      })
      try {
        val futures: Seq[Future[CopiedStore]] = tasks.map(t => pool.submit(() => copy(t)))
        var reported = System.currentTimeMillis()
        val copied = futures.zipWithIndex.map { case (f, i) =>
          val done = try f.get() catch { case e: ExecutionException => throw e.getCause }
          if (System.currentTimeMillis() - reported >= ProgressEveryMs) {
            progress(s"copy: ${i + 1}/${tasks.size} store partitions done")
            reported = System.currentTimeMillis()
          }
          done
        }
        progress(s"copy: ${tasks.size}/${tasks.size} store partitions done")
        copied
      } catch {
        case NonFatal(e) =>
          pool.shutdownNow()
          pool.awaitTermination(StopWaitMs, TimeUnit.MILLISECONDS)
          throw e
      } finally pool.shutdownNow()
    }
}
