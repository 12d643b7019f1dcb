package io.keyedstate

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8
import java.util.concurrent.{CountDownLatch, TimeUnit}

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateStateException}
import io.keyedstate.rocks.LocalRocksDB

/**
 * The instance's native handles under the threads that really share it: the task thread drops
 * column families and Spark's listeners close instances while a keyed function's lookup thread
 * (Spark's pipelined Python runner) or the maintenance thread reads. A drop or a close waits for
 * the reads in flight and refuses later ones with an error: no thread uses a closed handle.
 */
class LocalRocksDBConcurrencySuite extends AnyFunSuite with ProviderFixture {
  private val Default = LocalRocksDB.DefaultColumnFamily
  private def b(s: String): Array[Byte] = s.getBytes(UTF_8)

  private def withDb(body: LocalRocksDB => Unit): Unit = {
    val db = LocalRocksDB.open(new File(tempDir(), "db"), KeyedStateConf.fromMap(Map.empty))
    try body(db) finally db.close()
  }

  /**
   * A point read in another thread, parked just before it reads RocksDB (its handle held) until
   * released. If the thread that should have waited for it did not, the read is abandoned: it
   * throws before touching the handle that was closed under it.
   */
  private final class ParkedRead(db: LocalRocksDB, cf: String, key: Array[Byte]) {
    private val parked = new CountDownLatch(1)
    private val go = new CountDownLatch(1)
    @volatile private var abandoned = false
    @volatile var result: Either[Throwable, String] = _
    db.beforeNativeReadForTest = () => {
      parked.countDown()
      go.await()
      if (abandoned) throw new IllegalStateException("abandoned: its handle was closed under it")
    }
    private val thread = new Thread(() => result =
      try Right(Option(db.get(cf, key)).map(new String(_, UTF_8)).orNull) catch { case e: Throwable => Left(e) })
    thread.start()
    assert(parked.await(10, TimeUnit.SECONDS), "the read did not reach RocksDB")

    def release(abandon: Boolean): Unit = {
      db.beforeNativeReadForTest = null
      abandoned = abandon
      go.countDown()
      thread.join(10000)
    }
  }

  /** Runs `other` in a thread while the read is parked: whether it waited for the read. */
  private def waitsForTheRead(read: ParkedRead)(other: => Unit): Boolean = {
    val t = new Thread(() => other)
    t.start()
    t.join(1000)
    val waited = t.isAlive
    read.release(abandon = !waited)
    t.join(10000)
    assert(!t.isAlive)
    waited
  }

  test("a column family dropped while another thread reads it: the drop waits, later reads fail naming it") {
    withDb { db =>
      db.createColumnFamily("cf")
      db.put("cf", b("k"), b("v"))
      db.flush() // into RocksDB: the read goes to its handle
      val read = new ParkedRead(db, "cf", b("k"))
      assert(waitsForTheRead(read)(db.dropColumnFamily("cf")), "the drop closed the handle a read held")
      assert(read.result == Right("v"))
      assert(!db.hasColumnFamily("cf"))
      val e = intercept[IllegalStateException](db.get("cf", b("k")))
      assert(e.getMessage.contains("column family 'cf' does not exist"), e.getMessage)
    }
  }

  test("an instance closed while another thread reads: the close waits, later calls fail naming the instance") {
    withDb { db =>
      db.put(Default, b("k"), b("v"))
      db.flush()
      val scan = db.scan(Default, None, None) // left open, between two steps, as a slow consumer leaves it
      assert(scan.hasNext)
      val read = new ParkedRead(db, Default, b("k"))
      assert(waitsForTheRead(read)(db.close()), "the close closed the instance under a read")
      assert(read.result == Right("v"))
      def closedError(call: => Any): Unit = {
        val e = intercept[KeyedStateStateException](call)
        assert(e.error == ErrorId.StoreClosed && e.getMessage.contains(db.dir.toString), e.getMessage)
      }
      closedError(db.get(Default, b("k")))
      closedError(db.exists(Default, b("k")))
      closedError(db.put(Default, b("k"), b("w")))
      closedError(db.prefixScan(Default, b("k")))
      closedError(scan.next()) // the open scan's next step
    }
  }
}

