package io.keyedstate.rocks

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8
import java.util.concurrent.{CountDownLatch, TimeUnit}

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateStateException}
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.ProviderFixture

/**
 * The instance's native handles under the threads that really share it: the task thread drops
 * column families and Spark's listeners close instances while a keyed function's lookup thread
 * (Spark's pipelined Python runner) or the maintenance thread reads. A drop or a close waits for
 * the reads in flight and refuses later ones with an error: no thread uses a closed handle.
 */
class LocalRocksDBConcurrencySuite extends AnyFunSuite with ProviderFixture {
  private val Default = LocalRocksDB.DefaultColumnFamily
  private def b(s: String): Array[Byte] = s.getBytes(UTF_8)

  private def withDb(body: LocalRocksDB => Unit): Unit = withDb(KeyedStateConf.fromMap(Map.empty))(body)

  private def withDb(conf: KeyedStateConf)(body: LocalRocksDB => Unit): Unit = {
    val db = LocalRocksDB.open(new File(tempDir(), "db"), conf)
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
    db.testHooks.beforeNativeRead = () => {
      parked.countDown()
      go.await()
      if (abandoned) throw new IllegalStateException("abandoned: its handle was closed under it")
    }
    private val thread = new Thread(() => result =
      try Right(Option(db.get(cf, key)).map(new String(_, UTF_8)).orNull) catch { case e: Throwable => Left(e) })
    thread.start()
    assert(parked.await(10, TimeUnit.SECONDS), "the read did not reach RocksDB")

    def release(abandon: Boolean): Unit = {
      db.testHooks.beforeNativeRead = null
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

  test("a reader thread beside random writes, freezes, writes past the bound and drops: reads never go back") {
    // 1 MB for the JVM's buffers and values of 1 KB: the bound is crossed every few hundred writes.
    withDb(KeyedStateConf.fromMap(Map(KeyedStateConf.Prefix + "heapWriteBufferMB" -> "1"))) { db =>
      val families = Seq(Default, "a", "b")
      families.tail.foreach(db.createColumnFamily)
      // A value is "<incarnation>:<write>:<padding>": per key, later writes have greater pairs; the
      // family "b" is dropped and created again now and then (its next incarnation).
      val incarnation = scala.collection.mutable.Map(families.map(_ -> 0): _*)
      val model = families.map(_ -> scala.collection.mutable.TreeMap[String, String]()).toMap
      val padding = "x" * 1000
      val failures = new java.util.concurrent.ConcurrentLinkedQueue[String]()
      @volatile var stop = false
      def parse(v: Array[Byte]): (Int, Int) = {
        val parts = new String(v, UTF_8).split(":", 3)
        (parts(0).toInt, parts(1).toInt)
      }
      val reader = new Thread(() => {
        val random = new scala.util.Random(7)
        val seen = scala.collection.mutable.Map[(String, String), (Int, Int)]()
        while (!stop) {
          val cf = families(random.nextInt(families.size))
          val key = f"k${random.nextInt(200)}%03d"
          try {
            val v = db.get(cf, b(key))
            if (v != null) {
              val now = parse(v)
              seen.get((cf, key)).filter(before => Ordering[(Int, Int)].lt(now, before)).foreach { before =>
                failures.add(s"$cf $key read $now after $before")
              }
              seen((cf, key)) = now
            }
            if (random.nextInt(20) == 0) {
              val it = db.prefixScan(cf, b(key.take(3)))
              try it.foreach { case (k, value) =>
                if (!new String(k, UTF_8).startsWith(key.take(3))) failures.add(s"$cf scan of ${key.take(3)} gave ${new String(k, UTF_8)}")
                parse(value)
              } finally it.close()
            }
          } catch {
            case e: IllegalStateException
                if e.getMessage.contains("does not exist") || e.getMessage.contains("was dropped") => // "b", meanwhile
            case e: Throwable => failures.add(s"$cf $key: $e"); stop = true
          }
        }
      })
      reader.start()
      try {
        val random = new scala.util.Random(11)
        (1 to 20000).foreach { i =>
          val cf = families(random.nextInt(families.size))
          val key = f"k${random.nextInt(200)}%03d"
          random.nextInt(100) match {
            case n if n < 75 =>
              val v = s"${incarnation(cf)}:$i:$padding"
              db.put(cf, b(key), b(v))
              model(cf)(key) = v
            case n if n < 95 => db.delete(cf, b(key)); model(cf).remove(key)
            case n if n < 97 =>
              val (from, to) = { val x = random.nextInt(200); val y = random.nextInt(200); (x min y, x max y) }
              db.deleteRange(cf, b(f"k$from%03d"), b(f"k$to%03d"))
              model(cf).keys.filter(k => k >= f"k$from%03d" && k < f"k$to%03d").toList.foreach(model(cf).remove)
            case 97 => db.flushInBackground() // the commit before a snapshot: a freeze
            case 98 if i % 7 == 0 =>
              db.dropColumnFamily("b")
              db.createColumnFamily("b")
              incarnation("b") += 1
              model("b").clear()
            case _ =>
              assert(Option(db.get(cf, b(key))).map(new String(_, UTF_8)) == model(cf).get(key), s"$cf $key at $i")
          }
        }
      } finally {
        stop = true
        reader.join(30000)
      }
      assert(failures.isEmpty, failures.toArray.mkString("; "))
      families.foreach { cf =>
        val it = db.scan(cf, None, None)
        try assert(it.map { case (k, v) => new String(k, UTF_8) -> new String(v, UTF_8) }.toList == model(cf).toList, cf)
        finally it.close()
      }
    }
  }
}
