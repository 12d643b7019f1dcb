package io.keyedstate.bench

import java.io.File
import java.nio.file.Files

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.checkpoint.LocalFiles

/**
 * The provider's point reads and writes in one JVM, without Spark's operators around them:
 * batch 1 reads every key (all missing) and writes it, batch 2 reads every key (all found) and
 * rewrites it, each with exact key counting on and off (`trackNumKeys`). Then its parts, before
 * and after side by side in the same JVM: point reads ([[PointReadBench]]) and the key count's
 * memo ([[KeyMemoBench]]).
 *
 *   ./dev/sbt "Test/runMain io.keyedstate.bench.StoreMicroBench [keys] [rounds] [all|store|parts]" < /dev/null
 */
object StoreMicroBench {
  private val keySchema = StructType(Seq(StructField("k", StringType), StructField("n", IntegerType)))
  private val valueSchema = StructType(Seq(StructField("v", LongType)))

  def main(args: Array[String]): Unit = {
    val n = args.headOption.map(_.toInt).getOrElse(200000)
    val rounds = args.lift(1).map(_.toInt).getOrElse(5)
    val what = args.lift(2).getOrElse("all")
    println(s"keys=$n rounds=$rounds (best round reported) loadavg=${loadAvg()}")
    if (what != "parts") store(n, rounds)
    if (what != "store") parts(n, rounds)
    println(s"loadavg=${loadAvg()}")
  }

  private def parts(n: Int, rounds: Int): Unit = {
    val rows = PointReadBench.run(n, rounds) ++ KeyMemoBench.run(n, rounds)
    println()
    println(f"${"ns per operation"}%-32s ${"before"}%8s ${"after"}%8s ${"after/before"}%13s")
    rows.foreach { case (name, before, after) =>
      println(f"$name%-32s $before%8d $after%8d ${after.toDouble / before}%13.2f")
    }
  }

  private def store(n: Int, rounds: Int): Unit = {
    val keyProj = UnsafeProjection.create(keySchema)
    val valueProj = UnsafeProjection.create(valueSchema)
    // Rows built once: the loop measures the store, not the projections.
    val keys = Array.tabulate(n)(i => keyProj(InternalRow(UTF8String.fromString(s"user-$i"), i)).copy())
    val values = Array.tabulate(n)(i => valueProj(InternalRow(i.toLong)).copy())

    // Rounds alternate the settings, so load from elsewhere on the machine falls on both.
    val runs = (1 to rounds).flatMap(_ => Seq(true, false).map(track => track -> batches(keys, values, track)))
    val results = Seq(true, false).map { track =>
      track -> runs.collect { case (`track`, t) => t }.reduce((a, b) => (a._1 min b._1, a._2 min b._2))
    }
    println()
    println(f"${"trackNumKeys"}%-14s ${"batch 1: get miss + put"}%26s ${"batch 2: get hit + put"}%26s")
    results.foreach { case (track, (miss, hit)) =>
      println(f"${track.toString}%-14s ${miss / n}%22d ns/key ${hit / n}%22d ns/key")
    }
    val (on, off) = (results.head._2, results(1)._2)
    println(f"${"counting cost"}%-14s ${on._1.toDouble / off._1}%24.2fx ${on._2.toDouble / off._2}%24.2fx")
  }

  /** Nanoseconds of the reads and writes of batch 1 and of batch 2 (commits not included). */
  private def batches(keys: Array[UnsafeRow], values: Array[UnsafeRow], track: Boolean): (Long, Long) = {
    val root = Files.createTempDirectory("keyedstate-bench").toFile
    val provider = newProvider(root, track)
    try {
      val first = provider.getStore(0)
      val miss = timed(keys.indices.foreach { i =>
        if (first.get(keys(i)) != null) sys.error("unexpected hit")
        first.put(keys(i), values(i))
      })
      first.commit()
      val second = provider.getStore(1)
      val hit = timed(keys.indices.foreach { i =>
        if (second.get(keys(i)) == null) sys.error("unexpected miss")
        second.put(keys(i), values(i))
      })
      if (track && second.metrics.numKeys != keys.length) sys.error(s"numKeys ${second.metrics.numKeys}")
      second.commit()
      (miss, hit)
    } finally {
      provider.close()
      LocalFiles.deleteRecursively(root)
    }
  }

  private def newProvider(root: File, track: Boolean): KeyedStateStoreProvider = {
    val sql = new SQLConf()
    sql.setConfString("spark.sql.streaming.stateStore.commitValidation.enabled", "false")
    sql.setConfString("spark.sql.streaming.stateStore.keyedstate.trackNumKeys", track.toString)
    sql.setConfString("spark.sql.streaming.stateStore.keyedstate.localDir",
      new File(root, "local").getAbsolutePath)
    val p = new KeyedStateStoreProvider
    p.init(StateStoreId(new File(root, "ckpt").getAbsolutePath, 0, 0), keySchema, valueSchema,
      NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false, new StateStoreConf(sql),
      new Configuration(), useMultipleValuesPerKey = false, None)
    p
  }

  private def timed(f: => Unit): Long = {
    val start = System.nanoTime()
    f
    System.nanoTime() - start
  }

  private def loadAvg(): String =
    scala.util.Try(scala.io.Source.fromFile("/proc/loadavg").mkString.split(' ').take(3).mkString(" "))
      .getOrElse("n/a")
}
