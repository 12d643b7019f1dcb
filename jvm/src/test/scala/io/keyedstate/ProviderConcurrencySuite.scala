package io.keyedstate

import java.util.concurrent.ConcurrentLinkedQueue
import java.util.concurrent.atomic.AtomicLong

import org.apache.spark.SparkException
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateStateException}
import io.keyedstate.Eventually.eventually

/**
 * The provider under what meets its instance from other threads and from below: buffered writes
 * that fail to go into RocksDB (a full local disk), an abort after writes went into RocksDB past
 * the executor-wide bound, and an abort or an unload while a keyed function's lookup thread
 * (Spark's pipelined Python runner) reads. Each time the next load serves exactly the committed
 * version, and the thread that read meanwhile gets an error, never a crash.
 */
class ProviderConcurrencySuite extends AnyFunSuite with ProviderFixture {
  private val injected = new RuntimeException("no space left on device (injected)")

  private def keys(n: Int): Map[(String, Int), Long] = (0 until n).map(i => (s"k$i", 0) -> i.toLong).toMap

  for (changelog <- Seq(false, true)) {
    // Snapshot checkpointing writes the buffer into RocksDB in the commit; changelog
    // checkpointing commits first and writes it in the background before its next snapshot
    // (with a snapshot every 3 versions, version 2's commit starts it: VersionLineage's Prime).
    test(s"buffered writes that fail to go into RocksDB: the next load rebuilds the instance, the retry commits (changelog=$changelog)") {
      val root = tempDir()
      val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> (if (changelog) "3" else "1"),
        KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString)
      val p = newProvider(root, conf)
      val s0 = p.getStore(0)
      keys(5).foreach { case ((k, n), v) => s0.put(key(k, n), value(v)) }
      assert(s0.commit() == 1)

      val s1 = p.getStore(1)
      s1.put(key("k5"), value(5))
      s1.remove(key("k0"))
      val failed = p.loadedDbForTest
      failed.testHooks.spillFault = injected
      val committed =
        try { s1.commit(); true }
        catch {
          case e: SparkException =>
            assert(causes(e).contains(injected), e)
            s1.abort() // as Spark's task completion does
            false
        }
      if (changelog) assert(committed, "the changelog made the version durable before the background write")
      else assert(!committed, "the commit's own write into RocksDB failed")
      if (committed) {
        // The failure surfaces in the instance: its next store does not serve it.
        eventually(!failed.healthy)
      }

      // The retry (or the next batch): a new instance from the checkpoint, exactly the version.
      val expectedAt1 = keys(5)
      val expectedAt2 = keys(6) - (("k0", 0))
      val next = p.getStore(if (committed) 2 else 1)
      assert(p.loadedDbForTest ne failed, "the failed instance was served again")
      assert(contents(next) == (if (committed) expectedAt2 else expectedAt1))
      if (!committed) {
        next.put(key("k5"), value(5))
        next.remove(key("k0"))
      }
      next.put(key("k9"), value(9))
      val last = next.commit()
      val fresh = newProvider(root, conf)
      val r = fresh.getReadStore(last)
      assert(contents(r) == expectedAt2 + (("k9", 0) -> 9L))
      r.release(); p.close(); fresh.close()
    }
  }

  test("an abort after writes went into RocksDB past the bound: the same version loads exactly as committed") {
    val root = tempDir()
    val conf = storeConf(KeyedStateConf.Prefix + "heapWriteBufferMB" -> "1")
    val p = newProvider(root, conf)
    val s0 = p.getStore(0)
    keys(10).foreach { case ((k, n), v) => s0.put(key(k, n), value(v)) }
    assert(s0.commit() == 1)

    val s1 = p.getStore(1)
    val db = p.loadedDbForTest
    // About 3 MB of keys and values: three times the bound, so most went into RocksDB directly.
    (0 until 30000).foreach(i => s1.put(key(s"new-$i-" + "x" * 60, i), value(i)))
    (0 until 10 by 2).foreach(i => s1.remove(key(s"k$i")))
    s1.put(key("k1"), value(-1))
    assert(db.heapBufferedBytes < 1024 * 1024, "the writes stayed in the heap: the bound was not crossed")
    assert(db.totalSstFilesBytes > 0 || db.estimateNumKeys("default") > 10000, "nothing went into RocksDB")
    s1.abort()

    val again = p.getStore(1)
    assert(p.loadedDbForTest ne db, "the instance holding aborted writes was served again")
    assert(contents(again) == keys(10))
    again.put(key("k10"), value(10))
    assert(again.commit() == 2)
    val fresh = newProvider(root, conf)
    val r = fresh.getReadStore(2)
    assert(contents(r) == keys(11))
    r.release(); p.close(); fresh.close()
  }

  for (ending <- Seq("abort", "unload")) {
    test(s"an $ending while a lookup thread reads: the reader gets errors naming the store, never a crash; the next load is exact") {
      val root = tempDir()
      val p = newProvider(root)
      val s0 = p.getStore(0)
      keys(200).foreach { case ((k, n), v) => s0.put(key(k, n), value(v)) }
      assert(s0.commit() == 1)

      val s1 = p.getStore(1)
      (0 until 200 by 3).foreach(i => s1.put(key(s"k$i"), value(-i)))
      val reads = new AtomicLong()
      val unexpected = new ConcurrentLinkedQueue[Throwable]()
      @volatile var stop = false
      val reader = new Thread(() => {
        var i = 0
        while (!stop) {
          try {
            val v = s1.get(key(s"k${i % 200}"))
            val expected = if (i % 200 % 3 == 0) -(i % 200) else i % 200
            if (v == null || v.getLong(0) != expected) unexpected.add(new AssertionError(s"k${i % 200} read $v"))
            reads.incrementAndGet()
          } catch {
            // The store ended (its phase), or its instance closed under the read (StoreClosed).
            case e: KeyedStateStateException
                if e.error == ErrorId.StoreClosed || e.error == ErrorId.UnsupportedOperation => stop = true
            case e: Throwable => unexpected.add(e); stop = true
          }
          i += 1
        }
      })
      reader.start()
      eventually(reads.get() > 1000)
      if (ending == "abort") s1.abort() else p.close()
      reader.join(30000)
      assert(!reader.isAlive && unexpected.isEmpty, unexpected.toArray.mkString("; "))

      val q = if (ending == "abort") p else newProvider(root)
      val again = q.getStore(1)
      assert(contents(again) == keys(200))
      again.release(); q.close()
    }
  }

  test("a partition another thread holds past acquireTimeoutMs: that load is Spark's UNRELEASED_THREAD_ERROR, the holder commits") {
    val root = tempDir()
    val p = newProvider(root, storeConf(KeyedStateConf.Prefix + "acquireTimeoutMs" -> "300"))
    val s0 = p.getStore(0)
    s0.put(key("a"), value(1))
    assert(s0.commit() == 1)
    val held = p.getStore(1) // the first attempt, still running
    @volatile var failure: Throwable = null
    val started = System.nanoTime()
    val second = new Thread(() => try p.getStore(1).abort() catch { case e: Throwable => failure = e }, "second-attempt")
    second.start()
    second.join(60000)
    val waitedMs = (System.nanoTime() - started) / 1000000
    assert(failure != null, "the second attempt got the partition the first one holds")
    assert(failure.asInstanceOf[org.apache.spark.SparkThrowable].getCondition ==
      "CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR", failure)
    val busy = causes(failure).collectFirst { case e: KeyedStateStateException if e.error == ErrorId.StoreBusy => e }
    assert(busy.exists(_.getMessage.contains("Timed out after 300 ms")), causes(failure).map(_.getMessage))
    assert(waitedMs >= 300 && waitedMs < 30000, s"waited $waitedMs ms")
    held.put(key("b"), value(2))
    assert(held.commit() == 2)
    val r = newProvider(root, storeConf()).getReadStore(2)
    assert(contents(r) == Map(("a", 0) -> 1L, ("b", 0) -> 2L))
    r.release(); p.close()
  }

  private def causes(e: Throwable): List[Throwable] = if (e == null) Nil else e :: causes(e.getCause)

}
