package io.keyedstate.checkpoint

import java.nio.file.Files

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution
import org.scalatest.funsuite.AnyFunSuite

/** A lease is removed or refreshed only by its own holder: another run's stays as it is. */
class StoreLeaseSuite extends AnyFunSuite {
  private def runConf(run: String): Configuration = {
    val c = new Configuration()
    c.set(StreamExecution.RUN_ID_KEY, run)
    c
  }

  private def holderOf(store: Path, c: Configuration): Option[String] = StoreLease.fresh(store, c).map(_._1.queryRunId)

  test("a run releases and keeps alive only its own lease; releaseRun removes only that run's") {
    val root = new Path(Files.createTempDirectory("lease").toUri)
    val store = new Path(root, "state/0/1")
    val named = new Path(root, "state/0/2/left-keyToNumValues")
    val (a, b) = (runConf("run-a"), runConf("run-b"))
    assert(StoreLease.refresh(store, a, 0L) > 0)
    assert(holderOf(store, a).contains("run-a"))
    // Run b claims the store (a restart while run a's provider is still loaded).
    assert(StoreLease.refresh(store, b, 0L) > 0)
    // Run a's maintenance does not take it back, and its close does not remove it.
    StoreLease.refresh(store, a, 0L, keepAliveOnly = true)
    assert(holderOf(store, a).contains("run-b"))
    StoreLease.release(store, a)
    assert(holderOf(store, a).contains("run-b"))
    // Once gone (run b stopped), maintenance does not write it again.
    StoreLease.release(store, b)
    assert(holderOf(store, b).isEmpty)
    StoreLease.refresh(store, b, 0L, keepAliveOnly = true)
    assert(holderOf(store, b).isEmpty)
    // A stopped run's leases, named stores included; another run's stay.
    StoreLease.refresh(store, a, 0L)
    StoreLease.refresh(named, b, 0L)
    assert(StoreLease.releaseRun(new Path(root, "state"), "run-b", b) == 1)
    assert(holderOf(named, b).isEmpty && holderOf(store, a).contains("run-a"))
    assert(StoreLease.releaseRun(new Path(root, "state"), "run-a", a) == 1)
    assert(holderOf(store, a).isEmpty)
  }
}
