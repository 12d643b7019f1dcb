package io.keyedstate

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.scalatest.funsuite.AnyFunSuite

/**
 * The 4.3 store contract on one provider, on real RocksDB: reads and writes, abort and the
 * read-to-write upgrade, exact key counts, column families and multiple values per key, prefix
 * and range scans; random operations against a model (reads through the heap's write buffer).
 */
class StoreReadsWritesSuite extends AnyFunSuite with ProviderSuiteHelpers {

  test("abort drops the writes; the next store of the version sees the committed state") {
    val root = tempDir()
    val p = newProvider(root)
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val s = p.getStore(1)
    s.put(key("x"), value(9))
    s.remove(key("a"))
    assert(s.get(key("x")).getLong(0) == 9L) // reads see own writes
    s.abort()
    val again = p.getStore(1)
    assert(contents(again) == Map(("a", 0) -> 1L))
    again.put(key("y"), value(5))
    assert(again.commit() == 2)
    val fresh = newProvider(root)
    val r = fresh.getReadStore(2)
    assert(contents(r) == Map(("a", 0) -> 1L, ("y", 0) -> 5L))
    r.release(); p.close(); fresh.close()
  }

  test("a read store upgrades to the write store of the same version without reloading") {
    val p = newProvider(tempDir())
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val r = p.getReadStore(1)
    assert(r.get(key("a")).getLong(0) == 1L)
    val w = p.upgradeReadStoreToWriteStore(r, 1)
    assert(w eq r)
    w.put(key("a"), value(2))
    assert(w.commit() == 2)
    val load = w.metrics.customMetrics.collectFirst { case (m, v) if m.name == "keyedstateLoadMs" => v }
    assert(load.contains(0L))
    p.close()
  }

  test("a write store of the version the task's read store has open is that read store, upgraded (Spark 4.0)") {
    val p = newProvider(tempDir())
    commitWith(p, 0)(_.put(key("a"), value(1)))
    // Spark 4.0's aggregation: a read store, then a write store of its version, reads through both.
    val r = p.getReadStore(1)
    val w = p.getStore(1)
    assert(w eq r)
    w.put(key("b"), value(2))
    assert(r.get(key("a")).getLong(0) == 1L && r.get(key("b")).getLong(0) == 2L)
    assert(w.commit() == 2)
    r.release() // Spark 4.0 does not; a no-op on the committed store
    // Another version, or a store opened empty: a store of its own (the read store ends).
    val r2 = p.getReadStore(2)
    val other = p.getStore(2, None, forceSnapshotOnCommit = false, loadEmpty = true)
    assert(!(other eq r2))
    assert(contents(other).isEmpty)
    other.abort()
    val r3 = p.getReadStore(2)
    val w3 = p.getStore(1)
    assert(!(w3 eq r3))
    assert(contents(w3) == Map(("a", 0) -> 1L))
    w3.abort()
    p.close()
  }

  test("numKeys is exact across puts, overwrites, removes and restarts") {
    val root = tempDir()
    val p = newProvider(root)
    val s = p.getStore(0)
    (1 to 50).foreach(i => s.put(key(s"k$i"), value(i)))
    (1 to 10).foreach(i => s.put(key(s"k$i"), value(-i)))
    (41 to 60).foreach(i => s.remove(key(s"k$i")))
    s.commit()
    assert(s.metrics.numKeys == 40)
    val q = newProvider(root)
    val r = q.getStore(1)
    assert(r.metrics.numKeys == 40)
    assert(contents(r).size == 40)
    r.abort(); p.close(); q.close()
  }

  test("numKeys stays exact when families that held nothing are written without reads") {
    val root = tempDir()
    val p = newProvider(root, useColumnFamilies = true)
    val s = p.getStore(0)
    s.createColFamilyIfAbsent("fresh", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
    s.put(key("gone"), value(1))
    s.remove(key("gone"))
    s.commit() // the default family is empty again: a tombstone is not a key
    val t = p.getStore(1)
    Seq("fresh", StateStore.DEFAULT_COL_FAMILY_NAME).foreach { cf =>
      t.put(key("a"), value(1), cf); t.put(key("b"), value(2), cf); t.put(key("a"), value(3), cf)
      t.remove(key("never"), cf); t.remove(key("b"), cf); t.remove(key("b"), cf)
    }
    t.createColFamilyIfAbsent("lists", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
      useMultipleValuesPerKey = true)
    t.merge(key("l"), value(1), "lists"); t.mergeList(key("l"), Array(value(2)), "lists")
    assert(t.metrics.numKeys == 3) // a in both families, l
    t.commit()
    val q = newProvider(root, useColumnFamilies = true)
    val r = q.getStore(2)
    assert(r.metrics.numKeys == 3)
    r.abort(); p.close(); q.close()
  }

  test("column families with multiple values per key: merge, putList, valuesIterator, drop") {
    val root = tempDir()
    val p = newProvider(root, useColumnFamilies = true)
    val s = p.getStore(0)
    s.createColFamilyIfAbsent("lists", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
      useMultipleValuesPerKey = true)
    s.createColFamilyIfAbsent("single", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
    s.merge(key("a"), value(1), "lists")
    s.mergeList(key("a"), Array(value(2), value(3)), "lists")
    s.putList(key("b"), Array(value(7), value(8)), "lists")
    s.merge(key("c"), value(4), "lists")
    s.put(key("z"), value(26), "single")
    s.put(key("d"), value(0))
    assert(s.valuesIterator(key("a"), "lists").map(_.getLong(0)).toSeq == Seq(1L, 2L, 3L))
    assert(s.allColumnFamilyNames == Set("default", "lists", "single"))
    assert(intercept[UnsupportedOperationException](s.merge(key("x"), value(1), "single"))
      .getMessage.contains("single"))
    s.commit()

    val q = newProvider(root, useColumnFamilies = true)
    val r = q.getStore(1)
    r.createColFamilyIfAbsent("lists", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
      useMultipleValuesPerKey = true)
    r.createColFamilyIfAbsent("single", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
    assert(r.valuesIterator(key("b"), "lists").map(_.getLong(0)).toSeq == Seq(7L, 8L))
    val it = r.iteratorWithMultiValues("lists")
    val all = try it.map(pr => keyOf(pr.key)._1 -> pr.value.getLong(0)).toList finally it.close()
    assert(all == List("a" -> 1L, "a" -> 2L, "a" -> 3L, "b" -> 7L, "b" -> 8L, "c" -> 4L))
    assert(r.get(key("z"), "single").getLong(0) == 26L)
    assert(r.removeColFamilyIfExists("single"))
    assert(!r.removeColFamilyIfExists("single"))
    assert(r.allColumnFamilyNames == Set("default", "lists"))
    intercept[UnsupportedOperationException](r.removeColFamilyIfExists("default"))
    r.commit()
    val v2 = q.getReadStore(2)
    assert(v2.allColumnFamilyNames == Set("default", "lists"))
    v2.release(); p.close(); q.close()
  }

  test("column families need a store initialised with useColumnFamilies") {
    val p = newProvider(tempDir())
    val s = p.getStore(0)
    val e = intercept[UnsupportedOperationException] {
      s.createColFamilyIfAbsent("other", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
    }
    assert(e.getMessage.contains("other"))
    s.abort(); p.close()
  }

  test("prefix scan returns exactly the keys with the prefix (session windows use it)") {
    val root = tempDir()
    val p = newProvider(root, spec = PrefixKeyScanStateEncoderSpec(keySchema, 1))
    val s = p.getStore(0)
    Seq(("a", 1), ("a", 2), ("ab", 1), ("b", 1), ("", 3)).foreach { case (k, n) => s.put(key(k, n), value(n)) }
    def scan(st: ReadStateStore, pre: String) = {
      val it = st.prefixScan(prefix(pre))
      try it.map(pr => keyOf(pr.key)).toSet finally it.close()
    }
    assert(scan(s, "a") == Set(("a", 1), ("a", 2)))
    assert(scan(s, "ab") == Set(("ab", 1)))
    assert(scan(s, "") == Set(("", 3)))
    assert(scan(s, "c").isEmpty)
    s.commit()
    val q = newProvider(root, spec = PrefixKeyScanStateEncoderSpec(keySchema, 1))
    val r = q.getReadStore(1)
    assert(scan(r, "a") == Set(("a", 1), ("a", 2)))
    r.release(); p.close(); q.close()
  }

  test("numKeys stays exact when prefix scans tell which keys exist (puts after a scan read nothing back)") {
    val root = tempDir()
    val p = newProvider(root, spec = PrefixKeyScanStateEncoderSpec(keySchema, 1))
    val s = p.getStore(0)
    Seq(("a", 1), ("a", 2), ("ab", 1), ("b", 1)).foreach { case (k, n) => s.put(key(k, n), value(n)) }
    s.commit()
    val t = p.getStore(1)
    def drain(pre: String): Int = { val it = t.prefixScan(prefix(pre)); try it.size finally it.close() }
    assert(drain("a") == 2 && drain("c") == 0)
    // Under scanned prefixes: an existing key, new keys, a removed key, a removed absent key.
    t.put(key("a", 1), value(10)); t.put(key("a", 3), value(3)); t.put(key("c", 1), value(1))
    t.remove(key("a", 2)); t.remove(key("c", 9))
    // Under a prefix scanned only in part: "b" is not known to the memo.
    val partial = t.prefixScan(prefix("b")); partial.hasNext; partial.close()
    t.put(key("b", 1), value(2)); t.put(key("ab", 1), value(2))
    assert(t.metrics.numKeys == 5) // a1 a3 ab1 b1 c1
    t.commit()
    val q = newProvider(root, spec = PrefixKeyScanStateEncoderSpec(keySchema, 1))
    val r = q.getStore(2)
    assert(r.metrics.numKeys == 5)
    assert(contents(r).size == 5)
    r.abort(); p.close(); q.close()
  }

  test("reads through the write buffer agree with a model: values and exact counts (random operations)") {
    // Writes wait in the heap across commits, and are written into RocksDB in the background by
    // the commit before each snapshot (every 3 versions here): reads must see every write before
    // them wherever it is. Mixed reads, blind and read-first writes, removes, appends, scans and
    // dropped families, against a map; then a new provider loads the last version.
    val rnd = new scala.util.Random(7)
    val root = tempDir()
    val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "3")
    val spec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
    val p = newProvider(root, conf, spec = spec, useColumnFamilies = true)
    val model = scala.collection.mutable.Map[(String, Int), Long]()
    val lists = scala.collection.mutable.Map[(String, Int), Vector[Long]]()
    (0 until 10).foreach { v =>
      val s = p.getStore(v.toLong)
      s.createColFamilyIfAbsent("lists", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
        useMultipleValuesPerKey = true)
      (0 until 3000).foreach { i =>
        val k = (s"p${rnd.nextInt(6)}", rnd.nextInt(200))
        val x = i.toLong + v * 10000
        rnd.nextInt(20) match {
          case op if op < 6 =>
            val got = Option(s.get(key(k._1, k._2))).map(_.getLong(0))
            assert(got == model.get(k), s"get $k at version $v, operation $i")
          case op if op < 9 => s.put(key(k._1, k._2), value(x)); model(k) = x // blind
          case op if op < 12 =>
            Option(s.get(key(k._1, k._2))).foreach(r => assert(model.get(k).contains(r.getLong(0))))
            s.put(key(k._1, k._2), value(x)); model(k) = x
          case op if op < 14 => s.remove(key(k._1, k._2)); model.remove(k)
          case op if op < 16 => s.merge(key(k._1, k._2), value(x), "lists"); lists(k) = lists.getOrElse(k, Vector()) :+ x
          case 16 =>
            val got = s.valuesIterator(key(k._1, k._2), "lists").map(_.getLong(0)).toVector
            assert(got == lists.getOrElse(k, Vector()), s"valuesIterator $k at version $v, operation $i")
          case 17 =>
            val it = s.prefixScan(prefix(k._1))
            val got = try it.map(pr => keyOf(pr.key) -> pr.value.getLong(0)).toMap finally it.close()
            assert(got == model.filter(_._1._1 == k._1).toMap, s"prefixScan ${k._1} at version $v, operation $i")
          case 18 => s.remove(key(k._1, k._2), "lists"); lists.remove(k)
          case _ =>
            if (rnd.nextInt(10) == 0) { // rare: a dropped family leaves the memo unable to vouch for writes
              s.removeColFamilyIfExists("lists"); lists.clear()
              s.createColFamilyIfAbsent("lists", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
                useMultipleValuesPerKey = true)
            }
        }
      }
      assert(s.metrics.numKeys == model.size + lists.size, s"numKeys at version $v")
      s.commit()
    }
    p.close()
    val q = newProvider(root, conf, spec = spec, useColumnFamilies = true)
    val r = q.getStore(10)
    try {
      r.createColFamilyIfAbsent("lists", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
        useMultipleValuesPerKey = true)
      assert(contents(r) == model.toMap)
      lists.foreach { case (k, xs) => assert(r.valuesIterator(key(k._1, k._2), "lists").map(_.getLong(0)).toVector == xs) }
    } finally { r.abort(); q.close() }
  }

  test("range scan and deleteRange follow the order of the ordering columns, negatives included") {
    val tsSchema = StructType(Seq(StructField("t", LongType), StructField("k", StringType)))
    val proj = UnsafeProjection.create(tsSchema)
    def tk(t: Long, k: String = "x"): UnsafeRow = proj(InternalRow(t, UTF8String.fromString(k))).copy()
    val p = newProvider(tempDir(), useColumnFamilies = true)
    val s = p.getStore(0)
    s.createColFamilyIfAbsent("byTime", tsSchema, valueSchema, RangeKeyScanStateEncoderSpec(tsSchema, Seq(0)))
    val times = Seq(100L, -5L, 3L, 10L, Long.MinValue, 0L, -100L)
    times.foreach(t => s.put(tk(t), value(t), "byTime"))
    def range(st: ReadStateStore, from: Option[Long], to: Option[Long]): Seq[Long] = {
      val it = st.rangeScan(from.map(tk(_, "")), to.map(tk(_, "")), "byTime")
      try it.map(_.key.getLong(0)).toList finally it.close()
    }
    assert(range(s, None, None) == times.sorted)
    assert(range(s, Some(-5), Some(100)) == Seq(-5L, 0L, 3L, 10L))
    assert(range(s, Some(11), None) == Seq(100L))
    s.deleteRange(tk(-100, ""), tk(3, ""), "byTime")
    assert(range(s, None, None) == Seq(Long.MinValue, 3L, 10L, 100L))
    intercept[UnsupportedOperationException](s.rangeScan(None, None))
    s.commit()
    p.close()
  }
}
