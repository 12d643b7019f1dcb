package io.keyedstate

import java.io.File
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{Dataset, Encoders, SparkSession}
import org.apache.spark.sql.execution.streaming.runtime.MemoryStream
import org.apache.spark.sql.streaming.{GroupState, GroupStateTimeout, OutputMode}
import org.scalatest.BeforeAndAfterAll
import org.scalatest.funsuite.AnyFunSuite

/**
 * flatMapGroupsWithState on real Spark: the same query over the same input, under Spark's own
 * RocksDB provider and under ours, stopped mid-stream and restarted from its checkpoint, must
 * produce the same output batch for batch.
 */
class FlatMapGroupsWithStateEquivalenceSuite extends AnyFunSuite with BeforeAndAfterAll with ProviderFixture {
  import FlatMapGroupsWithStateEquivalenceSuite._

  private var spark: SparkSession = _

  override def beforeAll(): Unit = {
    spark = SparkSession.builder()
      .master("local[2]")
      .appName("keyedstate-fmgws")
      .config("spark.ui.enabled", "false")
      .config("spark.sql.shuffle.partitions", "3")
      .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
      .getOrCreate()
  }

  override def afterAll(): Unit = if (spark != null) spark.stop()

  private val rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
  private val ours = classOf[KeyedStateStoreProvider].getName

  /** Runs the batches in two runs of the query (a restart between them); output per batch. */
  private def run(provider: String, phases: Seq[Seq[Seq[(String, Int)]]]): Map[Long, Seq[String]] = {
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    val checkpoint = new File(tempDir(), "checkpoint").getAbsolutePath
    val input = MemoryStream[(String, Int)](Encoders.product[(String, Int)], spark.sqlContext)
    val output = new ConcurrentHashMap[Long, Seq[String]]()
    phases.foreach { batches =>
      val query = runningCounts(input.toDS()).writeStream
        .outputMode(OutputMode.Update())
        .option("checkpointLocation", checkpoint)
        .foreachBatch { (df: Dataset[String], batchId: Long) =>
          output.put(batchId, df.collect().toSeq.sorted)
          ()
        }
        .start()
      try batches.foreach { b => input.addData(b); query.processAllAvailable() }
      finally query.stop()
    }
    output.asScala.toMap
  }

  private val phases = Seq(
    Seq(Seq("a" -> 1, "b" -> 2, "a" -> 3), Seq("c" -> 1, "a" -> 1), Seq("b" -> 5)),
    Seq(Seq("a" -> 2, "d" -> 1), Seq("c" -> 10, "c" -> 1, "b" -> 1), Seq("a" -> 1, "e" -> 2)))

  test("checkpoint format v2: commit ids flow through the commit log and back into loads") {
    spark.conf.set("spark.sql.streaming.stateStore.checkpointFormatVersion", "2")
    try {
      val expected = run(rocksdb, phases)
      val actual = run(ours, phases)
      assert(actual == expected)
      assert(actual.size == 6)
    } finally spark.conf.unset("spark.sql.streaming.stateStore.checkpointFormatVersion")
  }

  test("flatMapGroupsWithState: same output as Spark's RocksDB provider across a restart") {
    val expected = run(rocksdb, phases)
    val actual = run(ours, phases)
    assert(actual == expected)
    assert(actual.size == 6, actual)
    // key a: 1+3 → 4 in batch 0, +1 → 5 in batch 1, +2 → 7 in batch 3 ends the key (state removed), then starts over.
    assert(expected(0L).contains("a,2,4"))
    assert(expected(3L).contains("a,4,7,done"))
    assert(expected(5L).contains("a,1,1"))
  }
}

object FlatMapGroupsWithStateEquivalenceSuite {
  /** Running (events, sum) per key; a key whose sum reaches 7 is reported done and forgotten. */
  def runningCounts(events: Dataset[(String, Int)]): Dataset[String] = {
    import events.sparkSession.implicits._
    events.groupByKey(_._1).flatMapGroupsWithState(OutputMode.Update(), GroupStateTimeout.NoTimeout()) {
      (key: String, values: Iterator[(String, Int)], state: GroupState[(Int, Int)]) =>
        val (n, sum) = values.foldLeft(state.getOption.getOrElse((0, 0))) { case ((c, s), (_, v)) => (c + 1, s + v) }
        if (sum >= 7) { state.remove(); Iterator(s"$key,$n,$sum,done") }
        else { state.update((n, sum)); Iterator(s"$key,$n,$sum") }
    }
  }
}
