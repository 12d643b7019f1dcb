package io.keyedstate.rocks

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.Files

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import org.jetbrains.kotlinx.lincheck.{Actor, LinChecker}
import org.jetbrains.kotlinx.lincheck.annotations.{Operation, Param}
import org.jetbrains.kotlinx.lincheck.execution.ExecutionScenario
import org.jetbrains.kotlinx.lincheck.paramgen.IntGen
import org.jetbrains.kotlinx.lincheck.strategy.managed.modelchecking.ModelCheckingOptions
import org.jetbrains.kotlinx.lincheck.strategy.stress.StressOptions
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.TestScale
import io.keyedstate.checkpoint.LocalFiles
import io.keyedstate.conf.KeyedStateConf

/**
 * JetBrains' Lincheck runs random concurrent scenarios of the store's operations and checks that
 * every outcome is one a sequential run of the same operations could give (linearizability).
 *
 * - [[GuardedHandle]], the lowest level, in model checking mode: Lincheck itself schedules the
 *   threads and explores their interleavings, so a use of a handle after its retire is found
 *   whichever instruction it would need to fall between.
 * - [[LocalRocksDB]] in stress mode (real threads: its work is native RocksDB calls and a
 *   background spill thread that Lincheck cannot schedule): the task thread's puts, merges,
 *   deletes, range deletes, ingested files, freezes with their background write, writes past the
 *   executor-wide bound, drops and creates of a column family, beside point reads, existence
 *   checks, prefix scans and range scans in two other threads.
 */
class LinearizabilitySuite extends AnyFunSuite {
  test("a column family's handle: no use after its retire, in every interleaving Lincheck explores (model checking)") {
    LinChecker.check(classOf[GuardedHandleOperations], new ModelCheckingOptions()
      .iterations(TestScale(ci = 8, full = 20)).invocationsPerIteration(200).threads(3).actorsPerThread(2)
      .sequentialSpecification(classOf[GuardedHandleModel]))
  }

  test("the store's writes, freezes, bound spills and drops beside reads in two threads are linearizable (stress)") {
    val options = new StressOptions()
      .iterations(TestScale(ci = 12, full = 30)).invocationsPerIteration(60).threads(3).actorsPerThread(3).actorsBefore(2).actorsAfter(1)
      .sequentialSpecification(classOf[StoreModel])
    // Random scenarios rarely line a read up with a window; these do, and run as many times.
    // Reads of writes that happened before, while the buffer holding them is frozen and written.
    options.addCustomScenario(scenario(
      Seq("put" -> Seq(0, 1, 1), "put" -> Seq(1, 2, 2), "merge" -> Seq(0, 3, 1)),
      Seq("freeze" -> Nil, "ingest" -> Seq(0, 1, 3), "put" -> Seq(0, 3, 4)),
      Seq("get" -> Seq(0, 1), "get" -> Seq(1, 2), "get" -> Seq(0, 3)),
      Seq("exists" -> Seq(0, 1), "prefixScan" -> Seq(0), "scan" -> Seq(1))))
    // Writes that cross the bound (four values of 200 KB are held, the fifth spills them all).
    options.addCustomScenario(scenario(
      Seq("put" -> Seq(0, 1, 1), "put" -> Seq(0, 2, 2), "put" -> Seq(1, 3, 3), "put" -> Seq(1, 4, 4)),
      Seq("put" -> Seq(0, 3, 5), "merge" -> Seq(0, 1, 2), "delete" -> Seq(0, 2)),
      Seq("get" -> Seq(0, 1), "get" -> Seq(0, 2), "get" -> Seq(1, 4)),
      Seq("prefixScan" -> Seq(0), "exists" -> Seq(0, 2), "scan" -> Seq(1))))
    // A family dropped and created again while other threads read it.
    options.addCustomScenario(scenario(
      Seq("put" -> Seq(1, 1, 1), "put" -> Seq(1, 3, 1), "freeze" -> Nil, "merge" -> Seq(1, 3, 2)),
      Seq("dropB" -> Nil, "createB" -> Nil, "put" -> Seq(1, 1, 2)),
      Seq("get" -> Seq(1, 1), "scan" -> Seq(1), "get" -> Seq(1, 3)),
      Seq("prefixScan" -> Seq(1), "exists" -> Seq(1, 3), "get" -> Seq(1, 1))))
    try LinChecker.check(classOf[StoreOperations], options) finally StoreOperations.closeLast()
  }

  /** A scenario of [[StoreOperations]]: what runs first, then the threads in parallel. */
  private def scenario(init: Seq[(String, Seq[Int])], threads: Seq[(String, Seq[Int])]*): ExecutionScenario = {
    def actors(calls: Seq[(String, Seq[Int])]): java.util.List[Actor] = calls.map { case (name, args) =>
      val method = classOf[StoreOperations].getMethods.find(_.getName == name).get
      new Actor(method, args.map(Int.box).asJava, false, false, false, false, false)
    }.asJava
    new ExecutionScenario(actors(init), threads.map(actors).asJava, actors(Nil), null)
  }
}

/** A use: acquire, check the handle was not closed meanwhile, release; the drop: retire, then close. */
class GuardedHandleOperations {
  private val family = new GuardedHandle("cf", null)
  @volatile private var closed = false

  @Operation
  def use(): Boolean = family.tryAcquire() && {
    try {
      if (closed) throw new IllegalStateException("used after its handle was closed")
      true
    } finally family.release()
  }

  @Operation
  def drop(): Unit = {
    family.retire()
    closed = true // what the drop does next: close the native handle
  }
}

class GuardedHandleModel {
  private var dropped = false
  def use(): Boolean = !dropped
  def drop(): Unit = dropped = true
}

/**
 * The store's operations on a fresh instance: family 0 is "a", never dropped; family 1 is "b",
 * which the task thread drops and creates again. Writes are the task thread's (one thread, as in
 * Spark); reads come from any thread. Values are big enough that a few writes cross the
 * executor-wide bound of 1 MB, after which writes go to RocksDB directly. Results are
 * summarised (the first bytes and the length), and a missing family is a result, not an error.
 */
class StoreOperations {
  import StoreOperations._

  private val dir = Files.createTempDirectory("keyedstate-lincheck").toFile
  private val db = LocalRocksDB.open(new File(dir, "db"), Conf)
  db.createColumnFamily("a")
  db.createColumnFamily("b")
  // Reads meet a frozen buffer not yet in RocksDB more often.
  db.testHooks.beforeBackgroundWrite = () => Thread.sleep(2)
  replaceLast(this)

  // A read that overlaps a drop of its family may end as though it came after the drop (a scan's
  // next step after the drop closed its iterator fails naming the drop).
  private def absentFamily[T](body: => T, absent: T): T =
    try body catch {
      case e: IllegalStateException if e.getMessage.contains("does not exist") || e.getMessage.contains("was dropped") =>
        absent
    }

  @Operation(nonParallelGroup = "task")
  def put(@Param(gen = classOf[IntGen], conf = "0:1") family: Int, @Param(gen = classOf[IntGen], conf = "1:4") key: Int,
      @Param(gen = classOf[IntGen], conf = "1:9") value: Int): String =
    absentFamily({ db.put(Names(family), keyBytes(key), putValue(value)); "ok" }, NoFamily)

  @Operation(nonParallelGroup = "task")
  def merge(@Param(gen = classOf[IntGen], conf = "0:1") family: Int, @Param(gen = classOf[IntGen], conf = "1:4") key: Int,
      @Param(gen = classOf[IntGen], conf = "1:9") value: Int): String =
    absentFamily({ db.merge(Names(family), keyBytes(key), operand(value)); "ok" }, NoFamily)

  @Operation(nonParallelGroup = "task")
  def delete(@Param(gen = classOf[IntGen], conf = "0:1") family: Int, @Param(gen = classOf[IntGen], conf = "1:4") key: Int): String =
    absentFamily({ db.delete(Names(family), keyBytes(key)); "ok" }, NoFamily)

  @Operation(nonParallelGroup = "task")
  def deleteRange(@Param(gen = classOf[IntGen], conf = "0:1") family: Int, @Param(gen = classOf[IntGen], conf = "1:4") from: Int,
      @Param(gen = classOf[IntGen], conf = "1:4") to: Int): String =
    absentFamily({ db.deleteRange(Names(family), keyBytes(from), keyBytes(to)); "ok" }, NoFamily)

  /** A value put by an SST file RocksDB takes in (as restores and rescales load state). */
  @Operation(nonParallelGroup = "task")
  def ingest(@Param(gen = classOf[IntGen], conf = "0:1") family: Int, @Param(gen = classOf[IntGen], conf = "1:4") key: Int,
      @Param(gen = classOf[IntGen], conf = "1:9") value: Int): String = absentFamily({
    val writer = new SstWriter(new File(dir, s"ingest-${java.util.UUID.randomUUID()}.sst"), Conf)
    try {
      writer.put(keyBytes(key), putValue(value))
      writer.finish()
    } finally writer.close()
    db.ingest(Names(family), Seq(writer.file))
    "ok"
  }, NoFamily)

  /** The commit before a snapshot: the buffer freezes and a background thread writes it into RocksDB. */
  @Operation(nonParallelGroup = "task")
  def freeze(): Unit = db.flushInBackground()

  @Operation(nonParallelGroup = "task")
  def flush(): Unit = db.flush()

  @Operation(nonParallelGroup = "task")
  def dropB(): Boolean = db.dropColumnFamily("b")

  @Operation(nonParallelGroup = "task")
  def createB(): Unit = db.createColumnFamily("b")

  @Operation
  def get(@Param(gen = classOf[IntGen], conf = "0:1") family: Int, @Param(gen = classOf[IntGen], conf = "1:4") key: Int): String =
    absentFamily(summary(db.get(Names(family), keyBytes(key))), NoFamily)

  @Operation
  def exists(@Param(gen = classOf[IntGen], conf = "0:1") family: Int, @Param(gen = classOf[IntGen], conf = "1:4") key: Int): String =
    absentFamily(db.exists(Names(family), keyBytes(key)).toString, NoFamily)

  /** Every entry of the family, by a prefix scan (the reused iterator, or its own when in use). */
  @Operation
  def prefixScan(@Param(gen = classOf[IntGen], conf = "0:1") family: Int): String =
    absentFamily(entries(db.prefixScan(Names(family), "k".getBytes(UTF_8))), NoFamily)

  /** Every entry of the family from the second key on, by a bounded scan. */
  @Operation
  def scan(@Param(gen = classOf[IntGen], conf = "0:1") family: Int): String =
    absentFamily(entries(db.scan(Names(family), Some(keyBytes(2)), None)), NoFamily)

  private def entries(it: ClosableIterator[(Array[Byte], Array[Byte])]): String =
    try it.map { case (k, v) => s"${new String(k, UTF_8)}=${summary(v)}" }.mkString(",") finally it.close()

  private[rocks] def close(): Unit = {
    db.close()
    LocalFiles.deleteRecursively(dir)
  }
}

object StoreOperations {
  val Conf: KeyedStateConf = KeyedStateConf.fromMap(Map(KeyedStateConf.Prefix + "heapWriteBufferMB" -> "1"))
  val Names: IndexedSeq[String] = IndexedSeq("a", "b")
  val NoFamily = "no such family"
  private val Padding = "." * (200 * 1024)

  def keyBytes(key: Int): Array[Byte] = s"k$key".getBytes(UTF_8)
  def putValue(value: Int): Array[Byte] = s"p$value$Padding".getBytes(UTF_8)
  def operand(value: Int): Array[Byte] = s"+$value".getBytes(UTF_8)

  def summary(value: Array[Byte]): String =
    if (value == null) "null"
    else {
      val s = new String(value, UTF_8)
      s"${s.filter(_ != '.')}/${s.length}"
    }

  // Lincheck makes an instance per scenario and runs the next once the last one's threads are
  // done: each closes the one before it, and the suite closes the last.
  private var last: StoreOperations = _

  private def replaceLast(next: StoreOperations): Unit = synchronized {
    if (last != null) last.close()
    last = next
  }

  def closeLast(): Unit = synchronized {
    if (last != null) last.close()
    last = null
  }
}

/** The sequential model: per family a sorted map; merge appends; "b" may not exist. */
class StoreModel {
  import StoreOperations._

  private val families = mutable.Map("a" -> mutable.TreeMap[String, Array[Byte]](), "b" -> mutable.TreeMap[String, Array[Byte]]())

  private def on(family: Int)(body: mutable.TreeMap[String, Array[Byte]] => String): String =
    families.get(Names(family)).map(body).getOrElse(NoFamily)
  private def key(k: Int): String = new String(keyBytes(k), UTF_8)

  def put(family: Int, k: Int, value: Int): String = on(family) { m => m(key(k)) = putValue(value); "ok" }
  def ingest(family: Int, k: Int, value: Int): String = put(family, k, value)
  def merge(family: Int, k: Int, value: Int): String = on(family) { m =>
    m(key(k)) = m.get(key(k)).fold(operand(value))(_ ++ operand(value)); "ok"
  }
  def delete(family: Int, k: Int): String = on(family) { m => m.remove(key(k)); "ok" }
  def deleteRange(family: Int, from: Int, to: Int): String = on(family) { m =>
    m.keys.filter(x => x >= key(from) && x < key(to)).toList.foreach(m.remove); "ok"
  }
  def freeze(): Unit = ()
  def flush(): Unit = ()
  def dropB(): Boolean = families.remove("b").isDefined
  def createB(): Unit = if (!families.contains("b")) families("b") = mutable.TreeMap()
  def get(family: Int, k: Int): String = on(family)(m => summary(m.get(key(k)).orNull))
  def exists(family: Int, k: Int): String = on(family)(_.contains(key(k)).toString)
  def prefixScan(family: Int): String = on(family)(_.map { case (k, v) => s"$k=${summary(v)}" }.mkString(","))
  def scan(family: Int): String = on(family)(_.rangeFrom(key(2)).map { case (k, v) => s"$k=${summary(v)}" }.mkString(","))
}
