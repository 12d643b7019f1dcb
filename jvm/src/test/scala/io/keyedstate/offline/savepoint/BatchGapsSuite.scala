package io.keyedstate.offline.savepoint

import java.nio.file.{Files, Path => NioPath}

import org.apache.hadoop.conf.Configuration
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.offline.QueryCheckpoint

/** A savepoint's wait for the gaps between a running query's batches, read from a real checkpoint's logs. */
class BatchGapsSuite extends AnyFunSuite {
  private def checkpoint(): (NioPath, QueryCheckpoint) = {
    val root = Files.createTempDirectory("batch-gaps")
    Files.createDirectories(root.resolve("offsets"))
    Files.createDirectories(root.resolve("commits"))
    for (b <- 0 to 2) {
      Files.writeString(root.resolve(s"offsets/$b"), "v1")
      Files.writeString(root.resolve(s"commits/$b"), "v1")
    }
    (root, QueryCheckpoint.at(root.toUri.toString, new Configuration()))
  }

  /** Runs `f` on a thread of its own after `ms` milliseconds (a query's commit, say). */
  private def after(ms: Long)(f: => Unit): Thread = {
    val t = new Thread(() => {
      Thread.sleep(ms)
      f
    })
    t.start()
    t
  }

  private def timedMs(f: => Unit): Long = {
    val began = System.nanoTime()
    f
    (System.nanoTime() - began) / 1000000
  }

  test("between batches nothing is waited for") {
    val (_, ckpt) = checkpoint()
    val gaps = new BatchGaps(ckpt, committed = 2)
    assert(timedMs((1 to 100).foreach(_ => gaps.await())) < 1000)
    assert(gaps.totalWaitMs < 1000)
  }

  test("a batch with offsets and no commit is waited for until it commits, then the next one too") {
    val (root, ckpt) = checkpoint()
    val gaps = new BatchGaps(ckpt, committed = 2)
    Files.writeString(root.resolve("offsets/3"), "v1")
    val committer = after(400)(Files.writeString(root.resolve("commits/3"), "v1"))
    assert(timedMs(gaps.await()) >= 350)
    committer.join()
    Files.writeString(root.resolve("offsets/4"), "v1")
    Thread.sleep(20) // the logs, seen idle a moment ago, are looked at again after 10 ms on a local disk
    val second = after(300)(Files.writeString(root.resolve("commits/4"), "v1"))
    assert(timedMs(gaps.await()) >= 250)
    second.join()
    assert(gaps.totalWaitMs >= 600)
  }

  test("the query's trigger in its own application is waited for before its offsets exist") {
    val (_, ckpt) = checkpoint()
    @volatile var active = true
    val gaps = new BatchGaps(ckpt, committed = 2, triggerActive = () => active)
    val ender = after(300) { active = false }
    assert(timedMs(gaps.await()) >= 250)
    ender.join()
  }

  test("a unit waits for the batch it found running, not for the next one that follows it at once") {
    val (root, ckpt) = checkpoint()
    Files.writeString(root.resolve("offsets/3"), "v1")
    val gaps = new BatchGaps(ckpt, committed = 2)
    val backToBack = after(300) {
      Files.writeString(root.resolve("offsets/4"), "v1") // planned before 3's commit is seen
      Files.writeString(root.resolve("commits/3"), "v1")
    }
    val waited = timedMs(gaps.await())
    backToBack.join()
    assert(waited >= 250 && waited < 2000, s"waited $waited ms")
  }

  test("offsets older than the longest wait without a commit are a stopped query's: not waited for") {
    val (root, ckpt) = checkpoint()
    val planned = root.resolve("offsets/3")
    Files.writeString(planned, "v1")
    Files.setLastModifiedTime(planned, java.nio.file.attribute.FileTime.fromMillis(System.currentTimeMillis() - 60000))
    val gaps = new BatchGaps(ckpt, committed = 2)
    assert(timedMs((1 to 20).foreach(_ => gaps.await())) < 500)
  }

  test("a batch that does not commit in the longest wait ends the yielding, once") {
    val (_, ckpt) = checkpoint()
    val said = Seq.newBuilder[String]
    // A trigger that stays active (a very long batch): waited for once, then no more.
    val gaps = new BatchGaps(ckpt, committed = 2, triggerActive = () => true, maxWaitMs = 300, progress = said += _)
    assert(timedMs(gaps.await()) >= 300)
    assert(timedMs((1 to 10).foreach(_ => gaps.await())) < 200)
    assert(said.result().size == 1 && said.result().head.contains("batch 3 of"), said.result())
  }

  test("fresh offsets whose batch never commits are waited for until they are older than the longest wait") {
    val (root, ckpt) = checkpoint()
    Files.writeString(root.resolve("offsets/3"), "v1") // a query that died mid-batch a moment ago
    val gaps = new BatchGaps(ckpt, committed = 2, maxWaitMs = 300)
    val first = timedMs(gaps.await())
    assert(first >= 250 && first < 2000, s"waited $first ms")
    assert(timedMs((1 to 10).foreach(_ => gaps.await())) < 200)
  }

}
