package io.keyedstate.checkpoint

import java.util.concurrent.{Executors, ThreadFactory}
import java.util.concurrent.atomic.AtomicInteger

import scala.concurrent.{Await, ExecutionContext, ExecutionContextExecutorService, Future}
import scala.concurrent.duration.Duration

/** Parallel file transfers (uploads on commit, downloads on load), one pool per executor JVM. */
object Transfers {
  @volatile private var pool: ExecutionContext = _

  private def executionContext(threads: Int): ExecutionContext = synchronized {
    if (pool == null) pool = daemonPool("keyedstate-transfer", threads)
    pool
  }

  /** A fixed pool of daemon threads named `<prefix>-<n>` (shut down by its owner, if it has one). */
  def daemonPool(prefix: String, threads: Int): ExecutionContextExecutorService = {
    val counter = new AtomicInteger()
    val factory: ThreadFactory = r => {
      val t = new Thread(r, s"$prefix-${counter.incrementAndGet()}")
      t.setDaemon(true)
      t
    }
    ExecutionContext.fromExecutorService(Executors.newFixedThreadPool(threads, factory))
  }

  /** Runs `f` on every item in parallel; the first failure is rethrown after all finished. */
  def parallel[A, B](items: Seq[A], threads: Int)(f: A => B): Seq[B] =
    if (items.size <= 1 || threads <= 1) items.map(f) else parallelOn(executionContext(threads), items)(f)

  /** [[parallel]] on a pool of the caller's (work that may block, which the JVM's transfer pool must not wait for). */
  def parallelOn[A, B](pool: ExecutionContext, items: Seq[A])(f: A => B): Seq[B] = {
    implicit val ec: ExecutionContext = pool
    val futures = items.map(a => Future(f(a)))
    val settled = futures.map(fu => Await.ready(fu, Duration.Inf).value.get)
    settled.map(_.get)
  }
}
