package io.keyedstate.ttl

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.Files

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.ttl.TtlClock
import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.ProviderFixture

/**
 * TTL on the real provider: semantics (update type x visibility, processing and event time),
 * each cleanup strategy removing entries for real (exact key counts, raw RocksDB contents, SST
 * bytes), metrics, TTL changed across a restart, per-column-family TTL, join refusal and option
 * errors. Time comes from the offset log entries each test writes, as a query's would.
 */
class TtlSuite extends AnyFunSuite with ProviderFixture {

  private val P = KeyedStateConf.Prefix + "ttl."

  /** A query checkpoint: `<base>/state` is the state root, `<base>/offsets/<batch>` the clock. */
  private final class Query(val base: File = tempDir()) {
    val stateRoot = new File(base, "state")
    stateRoot.mkdirs()
    def batch(id: Long, processingMs: Long, watermarkMs: Long = 0): Unit = {
      val dir = new File(base, "offsets")
      dir.mkdirs()
      val json = s"""{"batchWatermarkMs":$watermarkMs,"batchTimestampMs":$processingMs,"conf":{}}"""
      Files.write(new File(dir, id.toString).toPath, s"v1\n$json\n{\"logOffset\":$id}".getBytes(UTF_8))
    }
  }

  private def ttlConf(settings: (String, String)*): StateStoreConf =
    storeConf(settings.map { case (k, v) => (if (k.startsWith("spark.")) k else P + k) -> v }: _*)

  private def metric(s: StateStore, name: String): Long =
    s.metrics.customMetrics.collectFirst { case (m, v) if m.name == name => v }.get

  /** Opens version `v` at the given batch time, runs `f`, commits; returns the committed store. */
  private def batch(q: Query, p: KeyedStateStoreProvider, v: Long, at: Long, wm: Long = 0)(
      f: StateStore => Unit): StateStore = {
    q.batch(v, at, wm)
    val s = p.getStore(v)
    f(s)
    s.commit()
    p.awaitSnapshotUpload()
    s
  }

  private def get(s: ReadStateStore, k: String): Option[Long] = Option(s.get(key(k))).map(_.getLong(0))

  test("expired entries are invisible; a key seen again after expiry starts fresh; counts stay exact") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10s", "cleanup.fullSnapshot" -> "false"))
    batch(q, p, 0, at = 1000) { s => s.put(key("a"), value(1)); s.put(key("b"), value(2)) }
    batch(q, p, 1, at = 5000) { s =>
      assert(get(s, "a").contains(1L))
      s.put(key("b"), value(20)) // a write restarts b's time to live
    }
    val s2 = batch(q, p, 2, at = 11000) { s =>
      assert(get(s, "a").isEmpty && !s.keyExists(key("a")))
      assert(contents(s) == Map(("b", 0) -> 20L))
      s.put(key("a"), value(100)) // seen again: a new entry
    }
    assert(metric(s2, "ttlExpiredHidden") == 3)
    assert(s2.metrics.numKeys == 2 && p.rawEntryCount() == 2)
    batch(q, p, 3, at = 15000) { s =>
      assert(contents(s) == Map(("a", 0) -> 100L))
      assert(s.metrics.numKeys == 2) // b is expired but still stored: no strategy ran
    }
    p.close()
  }

  test("OnReadAndWrite: point reads of a write store refresh; scans and read stores do not") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10000", "updateType" -> "OnReadAndWrite"))
    batch(q, p, 0, at = 0) { s => Seq("a", "b", "c").foreach(k => s.put(key(k), value(1))) }
    q.batch(1, 8000)
    val r = p.getReadStore(1)
    assert(get(r, "c").contains(1L)) // a read store cannot refresh
    r.release()
    batch(q, p, 1, at = 8000) { s =>
      assert(get(s, "a").contains(1L))
      assert(contents(s).size == 3) // a scan: no refresh of b and c
    }
    batch(q, p, 2, at = 15000) { s => assert(contents(s) == Map(("a", 0) -> 1L)) }
    p.close()

    // OnCreateAndWrite: the same read does not refresh.
    val q2 = new Query()
    val p2 = newProvider(q2.stateRoot, ttlConf("duration" -> "10000"))
    batch(q2, p2, 0, at = 0)(_.put(key("a"), value(1)))
    batch(q2, p2, 1, at = 8000)(s => assert(get(s, "a").contains(1L)))
    batch(q2, p2, 2, at = 15000)(s => assert(get(s, "a").isEmpty))
    p2.close()
  }

  test("ReturnExpiredIfNotCleanedUp shows expired entries until full-snapshot cleanup removes them") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10s", "visibility" -> "ReturnExpiredIfNotCleanedUp",
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "3"))
    batch(q, p, 0, at = 0) { s => s.put(key("old"), value(1)) }
    val s1 = batch(q, p, 1, at = 20000) { s =>
      assert(get(s, "old").contains(1L)) // expired, still visible
      assert(contents(s).keySet == Set(("old", 0)))
      s.put(key("new"), value(2))
    }
    assert(metric(s1, "ttlRemovedFullSnapshot") == 0)
    val s2 = batch(q, p, 2, at = 20000) { s => assert(get(s, "old").contains(1L)) }
    // Version 3 is a snapshot commit: the expired entry is removed before the snapshot.
    assert(metric(s2, "ttlRemovedFullSnapshot") == 1 && metric(s2, "ttlExpiredHidden") == 0)
    assert(s2.metrics.numKeys == 1 && p.rawEntryCount() == 1)
    batch(q, p, 3, at = 20000) { s => assert(get(s, "old").isEmpty) }
    p.close()
    // A fresh provider (new executor) loads the cleaned state from the checkpoint.
    val fresh = newProvider(q.stateRoot, ttlConf("duration" -> "10s"))
    val r = fresh.getReadStore(3)
    assert(fresh.rawEntryCount() == 1 && contents(r).keySet == Set(("new", 0)))
    r.release()
    fresh.close()
  }

  test("OnReadAndWrite with ReturnExpiredIfNotCleanedUp: live reads refresh, stale reads are returned but not revived") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10s", "updateType" -> "OnReadAndWrite",
      "visibility" -> "ReturnExpiredIfNotCleanedUp", "cleanup.fullSnapshot" -> "false"))
    batch(q, p, 0, at = 0) { s => s.put(key("a"), value(1)); s.put(key("b"), value(2)) }
    batch(q, p, 1, at = 6000) { s => assert(get(s, "a").contains(1L)) } // a refreshed to 6000
    val s2 = batch(q, p, 2, at = 12000) { s =>
      assert(get(s, "a").contains(1L)) // alive: refreshed again, to 12000
      assert(get(s, "b").contains(2L)) // expired, shown, not refreshed
      assert(contents(s) == Map(("a", 0) -> 1L, ("b", 0) -> 2L))
    }
    assert(metric(s2, "ttlExpiredHidden") == 0)
    // An incremental pass at 21000 removes b (expired since 10000) and keeps a (until 22000).
    val p2 = newProvider(q.stateRoot, ttlConf("duration" -> "10s", "updateType" -> "OnReadAndWrite",
      "visibility" -> "ReturnExpiredIfNotCleanedUp", "cleanup.fullSnapshot" -> "false",
      "cleanup.incremental.size" -> "10"))
    p.close()
    val s3 = batch(q, p2, 3, at = 21000)(_ => ())
    assert(metric(s3, "ttlRemovedIncremental") == 1)
    batch(q, p2, 4, at = 21000) { s => assert(contents(s) == Map(("a", 0) -> 1L)) }
    p2.close()
  }

  test("event time: entries expire against the batch watermark, whatever the processing time") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "1 minute", "timeCharacteristic" -> "EventTime"))
    batch(q, p, 0, at = 1000000, wm = 100000) { s => s.put(key("a"), value(1)) }
    batch(q, p, 1, at = 99000000, wm = 159999) { s => assert(get(s, "a").contains(1L)) }
    batch(q, p, 2, at = 99000001, wm = 160000) { s => assert(get(s, "a").isEmpty) }
    p.close()
  }

  test("incremental cleanup: a persistent cursor checks N entries per commit, across restarts") {
    val q = new Query()
    val conf = ttlConf("duration" -> "10s", "cleanup.fullSnapshot" -> "false", "cleanup.incremental.size" -> "4")
    val p = newProvider(q.stateRoot, conf)
    // Version 1's commit checks k00..k03 (nothing has expired yet at time 0).
    batch(q, p, 0, at = 0) { s => (0 until 10).foreach(i => s.put(key(f"k$i%02d"), value(i))) }
    val s1 = batch(q, p, 1, at = 20000) { s => s.put(key("live"), value(1)) }
    assert(metric(s1, "ttlRemovedIncremental") == 4) // k04..k07
    assert(s1.metrics.numKeys == 7 && p.rawEntryCount() == 7)
    p.close()
    // The cursor is in the manifest: a new provider continues after the last key checked.
    val p2 = newProvider(q.stateRoot, conf)
    val s2 = batch(q, p2, 2, at = 20000)(_ => ())
    assert(metric(s2, "ttlRemovedIncremental") == 2) // k08, k09, then "live" (not expired): the end
    val s3 = batch(q, p2, 3, at = 20000)(_ => ())
    assert(metric(s3, "ttlRemovedIncremental") == 4) // from the start again: k00..k03
    assert(s3.metrics.numKeys == 1 && p2.rawEntryCount() == 1)
    batch(q, p2, 4, at = 20000)(s => assert(contents(s).keySet == Set(("live", 0))))
    p2.close()
  }

  test("incremental cleanup with everyRecord runs on every state access of a write store") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10s", "cleanup.fullSnapshot" -> "false",
      "cleanup.incremental.size" -> "2", "cleanup.incremental.everyRecord" -> "true"))
    batch(q, p, 0, at = 0) { s => (0 until 10).foreach(i => s.put(key(s"k$i"), value(i))) }
    // Ten puts at time 0 checked entries too, but none had expired.
    val s1 = batch(q, p, 1, at = 20000) { s =>
      s.get(key("x")); s.get(key("y")) // two accesses, two entries each
      assert(p.rawEntryCount() == 6)
    }
    assert(metric(s1, "ttlRemovedIncremental") == 4 && s1.metrics.numKeys == 6)
    p.close()
  }

  private def sstFilesContaining(dir: File, needle: String): Seq[String] = {
    val bytes = needle.getBytes(UTF_8)
    Option(dir.listFiles()).getOrElse(Array.empty[File]).toSeq.filter(_.getName.endsWith(".sst")).filter { f =>
      val data = Files.readAllBytes(f.toPath)
      data.indices.exists(i => i + bytes.length <= data.length && java.util.Arrays.equals(
        data, i, i + bytes.length, bytes, 0, bytes.length))
    }.map(_.getName)
  }

  /** Writes doomed and kept keys, lets the doomed expire, runs two snapshot commits; the SSTs containing "doomed". */
  private def doomedBytesAfterCleanup(strategy: (String, String)*): (Seq[String], Long, Long) = {
    val q = new Query()
    val conf = ttlConf(Seq("duration" -> "10s", KeyedStateConf.Prefix + "compression" -> "none",
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2") ++ strategy: _*)
    val p = newProvider(q.stateRoot, conf)
    batch(q, p, 0, at = 0) { s => (0 until 200).foreach(i => s.put(key(s"doomed-$i"), value(i))) }
    batch(q, p, 1, at = 1000) { s => (0 until 50).foreach(i => s.put(key(s"kept-$i"), value(i))) } // snapshot: flushed
    assert(sstFilesContaining(p.workingDbDir, "doomed-").nonEmpty)
    batch(q, p, 2, at = 30000) { s => (0 until 50).foreach(i => s.put(key(s"kept-$i"), value(i))) }
    val last = batch(q, p, 3, at = 30000)(_ => ()) // snapshot commit: the cleanup runs
    val result = (sstFilesContaining(p.workingDbDir, "doomed-"), metric(last, "ttlRemovedCompaction"), last.metrics.numKeys)
    assert(p.rawEntryCount() == 50)
    p.close()
    result
  }

  test("compaction cleanup: expired values and their tombstones leave the SST files") {
    val (withCompaction, removed, keys) = doomedBytesAfterCleanup("cleanup.compaction" -> "true")
    assert(withCompaction.isEmpty, withCompaction)
    assert(removed == 200 && keys == 50)
    // Full-snapshot cleanup alone removes the same entries logically; their bytes stay on disk
    // until RocksDB happens to compact them.
    val (withoutCompaction, _, keys2) = doomedBytesAfterCleanup("cleanup.fullSnapshot" -> "true")
    assert(withoutCompaction.nonEmpty && keys2 == 50)
  }

  test("background cleanup: the maintenance scan finds expired keys, the next commit re-checks and removes them") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10s", "cleanup.fullSnapshot" -> "false",
      "cleanup.background" -> "true"))
    batch(q, p, 0, at = 0) { s => (0 until 20).foreach(i => s.put(key(s"k$i"), value(i))) }
    batch(q, p, 1, at = 5000) { s => s.put(key("k0"), value(100)) } // k0 lives until 15000
    q.batch(2, 12000)
    val s = p.getStore(2)
    assert(get(s, "k5").isEmpty) // the batch's clock is known before the scan
    // The scan runs on the maintenance thread while the task holds the store.
    val found = new java.util.concurrent.atomic.AtomicInteger()
    val t = new Thread(() => found.set(p.backgroundTtlScan()))
    t.start(); t.join()
    assert(found.get == 19)
    assert(p.rawEntryCount() == 20) // the scan only reads
    s.put(key("k7"), value(7)) // rewritten after it was found: the commit's re-check keeps it
    s.commit()
    assert(metric(s, "ttlRemovedBackground") == 18)
    assert(s.metrics.numKeys == 2 && p.rawEntryCount() == 2)
    batch(q, p, 3, at = 12000) { s => assert(contents(s) == Map(("k0", 0) -> 100L, ("k7", 0) -> 7L)) }
    p.close()
  }

  test("multiple values per key: each element has its own time to live") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10s", "cleanup.fullSnapshot" -> "false",
      "cleanup.incremental.size" -> "10"), useColumnFamilies = true)
    val cf = "list"
    def values(s: ReadStateStore, k: String) = s.valuesIterator(key(k), cf).map(_.getLong(0)).toList
    batch(q, p, 0, at = 0) { s =>
      s.createColFamilyIfAbsent(cf, keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema), useMultipleValuesPerKey = true)
      s.merge(key("a"), value(1), cf); s.merge(key("b"), value(1), cf)
    }
    batch(q, p, 1, at = 5000) { s => s.merge(key("a"), value(2), cf) }
    val s2 = batch(q, p, 2, at = 12000) { s =>
      assert(values(s, "a") == List(2L) && values(s, "b").isEmpty)
      val it = s.iteratorWithMultiValues(cf)
      assert(it.map(pr => keyOf(pr.key)._1 -> pr.value.getLong(0)).toList == List("a" -> 2L))
    }
    // The commit's incremental pass dropped b and a's first element (a rewrite of a).
    assert(metric(s2, "ttlRemovedIncremental") == 2 && s2.metrics.numKeys == 1 && p.rawEntryCount(cf) == 1)
    batch(q, p, 3, at = 12000) { s => assert(values(s, "a") == List(2L)) }
    p.close()
  }

  test("per-column-family TTL: two states of one operator with different TTLs (Python API storage side)") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf(
      "operator.0.columnFamily.short.duration" -> "5s",
      "operator.0.columnFamily.long.duration" -> "20s",
      "operator.0.columnFamily.long.updateType" -> "OnReadAndWrite",
      "operator.0.columnFamily.short.cleanup.incremental.size" -> "100"), useColumnFamilies = true)
    val spec = NoPrefixKeyStateEncoderSpec(keySchema)
    batch(q, p, 0, at = 0) { s =>
      Seq("short", "long", "none").foreach { cf =>
        s.createColFamilyIfAbsent(cf, keySchema, valueSchema, spec, useMultipleValuesPerKey = false)
        s.put(key("k"), value(1), cf)
      }
    }
    val s1 = batch(q, p, 1, at = 10000) { s =>
      assert(s.get(key("k"), "short") == null)
      assert(s.get(key("k"), "long").getLong(0) == 1L) // refreshed to 10000
    }
    assert(metric(s1, "ttlRemovedIncremental") == 1) // only "short" has incremental cleanup
    batch(q, p, 2, at = 25000) { s =>
      assert(s.get(key("k"), "long").getLong(0) == 1L)
      assert(s.get(key("k"), "none").getLong(0) == 1L) // no TTL
    }
    batch(q, p, 3, at = 46000) { s => assert(s.get(key("k"), "long") == null) }
    p.close()
  }

  test("TTL changed across a restart: state written before keeps its timestamps") {
    val q = new Query()
    val noTtl = newProvider(q.stateRoot, ttlConf())
    batch(q, noTtl, 0, at = 0) { s => s.put(key("a"), value(1)) }
    batch(q, noTtl, 1, at = 50000) { s => s.put(key("b"), value(2)); assert(get(s, "a").contains(1L)) }
    noTtl.close()
    // TTL switched on: a was stamped at 0 without any TTL and is now expired; b is not.
    val withTtl = newProvider(q.stateRoot, ttlConf("duration" -> "30s", "cleanup.fullSnapshot" -> "false"))
    batch(q, withTtl, 2, at = 60000) { s => assert(contents(s) == Map(("b", 0) -> 2L)) }
    withTtl.close()
    // Made longer again: a was never removed, so it is visible again.
    val longer = newProvider(q.stateRoot, ttlConf("duration" -> "1h"))
    batch(q, longer, 3, at = 60000) { s => assert(contents(s) == Map(("a", 0) -> 1L, ("b", 0) -> 2L)) }
    longer.close()
  }

  test("the clock is the offset log's: a replay of a batch makes the same decisions") {
    val q = new Query()
    val p = newProvider(q.stateRoot, ttlConf("duration" -> "10s"))
    batch(q, p, 0, at = 0) { s => s.put(key("a"), value(1)) }
    q.batch(1, 10000)
    val attempt1 = p.getStore(1)
    assert(get(attempt1, "a").isEmpty)
    attempt1.put(key("b"), value(2))
    attempt1.abort()
    Thread.sleep(5)
    val fresh = newProvider(q.stateRoot, ttlConf("duration" -> "10s"))
    val attempt2 = fresh.getStore(1)
    assert(get(attempt2, "a").isEmpty)
    attempt2.abort()
    fresh.close()
    p.close()
    assert(TtlClock.at(q.stateRoot.getAbsolutePath, 1, new Configuration()).processingMs == 10000)
    // The version after the last batch (what the state data source reads): the last batch's time.
    assert(TtlClock.at(q.stateRoot.getAbsolutePath, 2, new Configuration()).processingMs == 10000)
    // No offset log (the provider driven directly): wall-clock time, watermark 0.
    val t = TtlClock.at(tempDir().getAbsolutePath + "/state", 7, new Configuration())
    assert(!t.fromOffsetLog && math.abs(t.processingMs - System.currentTimeMillis()) < 60000)
    assert(t.watermarkMs == 0)
  }

  test("TTL on stream-stream join state is refused at init, naming the operator; none exempts it") {
    val q = new Query()
    def joinProvider(conf: StateStoreConf): KeyedStateStoreProvider = {
      val p = new KeyedStateStoreProvider
      p.init(StateStoreId(q.stateRoot.getAbsolutePath, 4, 0, "left-keyToNumValues"), keySchema, valueSchema,
        NoPrefixKeyStateEncoderSpec(keySchema), false, conf, new Configuration(), false, None)
      p
    }
    val e = intercept[IllegalArgumentException](joinProvider(ttlConf("duration" -> "1h")))
    assert(e.getMessage.contains("operator 4") && e.getMessage.contains("stream-stream join"))
    assert(e.getMessage.contains(P + "operator.4.duration=none"))
    joinProvider(ttlConf("duration" -> "1h", "operator.4.duration" -> "none")).close()
    // Other operators' stores take the default.
    newProvider(q.stateRoot, ttlConf("duration" -> "1h")).close()
  }

  test("all strategies together under random operations: visible state matches a model, counts stay exact") {
    val q = new Query()
    val conf = ttlConf("duration" -> "5s", "updateType" -> "OnReadAndWrite", "cleanup.incremental.size" -> "3",
      "cleanup.compaction" -> "true", "cleanup.background" -> "true",
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "3")
    val rng = new scala.util.Random(7)
    val p = newProvider(q.stateRoot, conf)
    // key -> (value, last access)
    val model = scala.collection.mutable.Map[String, (Long, Long)]()
    var now = 0L
    val removed = scala.collection.mutable.Map[String, Long]().withDefaultValue(0L)
    for (v <- 0 until 30) {
      now += rng.nextInt(3000)
      def live(k: String) = model.get(k).filter(_._2 + 5000 > now)
      q.batch(v, now)
      val s = p.getStore(v)
      if (rng.nextBoolean()) p.backgroundTtlScan()
      for (_ <- 0 until 20) {
        val k = s"k${rng.nextInt(40)}"
        rng.nextInt(4) match {
          case 0 =>
            assert(get(s, k) == live(k).map(_._1), s"get $k at $now")
            live(k).foreach { case (value, _) => model(k) = (value, now) } // read refresh
          case 1 => s.remove(key(k)); model.remove(k)
          case _ =>
            val n = rng.nextInt(1000).toLong
            s.put(key(k), value(n)); model(k) = (n, now)
        }
      }
      assert(contents(s) == model.collect { case (k, (value, t)) if t + 5000 > now => (k, 0) -> value }.toMap)
      s.commit()
      p.awaitSnapshotUpload()
      assert(s.metrics.numKeys == p.rawEntryCount(), s"version ${v + 1}")
      Seq("ttlRemovedIncremental", "ttlRemovedCompaction", "ttlRemovedBackground").foreach(m => removed(m) += metric(s, m))
      // Whatever is stored beyond the visible state has expired.
      assert(p.rawEntryCount() >= model.count(_._2._2 + 5000 > now))
      assert(p.rawEntryCount() <= model.size)
    }
    p.close()
    assert(removed.size == 3 && removed.values.forall(_ > 0), removed) // every strategy had work
    val fresh = newProvider(q.stateRoot, conf)
    q.batch(30, now)
    val s = fresh.getStore(30)
    assert(contents(s) == model.collect { case (k, (value, t)) if t + 5000 > now => (k, 0) -> value }.toMap)
    assert(s.metrics.numKeys == fresh.rawEntryCount())
    s.abort()
    fresh.close()
  }

  test("invalid TTL options name the key, the value and what is allowed") {
    def fails(k: String, v: String, allowed: String): Unit = {
      val e = intercept[IllegalArgumentException](KeyedStateConf.fromMap(Map(P + k -> v)))
      assert(e.getMessage.contains(s"'$v'") && e.getMessage.contains(P + k) && e.getMessage.contains(allowed),
        e.getMessage)
    }
    fails("duration", "soon", "a positive duration")
    fails("duration", "0", "a positive duration")
    fails("operator.3.updateType", "OnRead", "one of OnCreateAndWrite, OnReadAndWrite")
    fails("visibility", "Sometimes", "NeverReturnExpired, ReturnExpiredIfNotCleanedUp")
    fails("operator.1.columnFamily.my.state.timeCharacteristic", "Wall", "ProcessingTime, EventTime")
    fails("cleanup.incremental.size", "-1", "an integer from 0")
    fails("cleanup.background", "yes", "true or false")
    Seq("durations", "operator.x.duration", "operator.1.cleanup", "operator.1.columnFamily..duration").foreach { k =>
      val e = intercept[IllegalArgumentException](KeyedStateConf.fromMap(Map(P + k -> "1")))
      assert(e.getMessage.contains(s"Unknown keyedstate option $P$k"), e.getMessage)
    }
    val ok = KeyedStateConf.fromMap(Map(P + "duration" -> "30 minutes", P + "operator.2.duration" -> "none",
      P + "operator.1.columnFamily.my.state.duration" -> "1500"))
    assert(ok.ttl.forColumnFamily(0, "default").durationMs.contains(1800000L))
    assert(ok.ttl.forColumnFamily(2, "default").durationMs.isEmpty)
    assert(ok.ttl.forColumnFamily(1, "my.state").durationMs.contains(1500L))
    assert(ok.ttl.forColumnFamily(1, "other").durationMs.contains(1800000L))
  }
}
