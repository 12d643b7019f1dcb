package io.keyedstate

import java.io.{File, RandomAccessFile}

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{CheckpointFileException, ErrorFamily, ErrorId, KeyedStateError, KeyedStateErrors}

/** The provider against the 4.3 contract, on real RocksDB and a real local Hadoop file system. */
class KeyedStateStoreProviderSuite extends AnyFunSuite with ProviderFixture {

  private def commitWith(p: StateStoreProvider, version: Long)(f: StateStore => Unit): Long = {
    val s = p.getStore(version)
    f(s)
    s.commit()
  }

  test("versions are durable and any retained version loads in a fresh provider (new executor)") {
    val root = tempDir()
    val a = newProvider(root)
    assert(commitWith(a, 0) { s => s.put(key("a"), value(1)); s.put(key("b"), value(2)) } == 1)
    assert(commitWith(a, 1) { s => s.put(key("c"), value(3)); s.remove(key("a")) } == 2)
    assert(commitWith(a, 2) { s => s.put(key("b"), value(20)) } == 3)
    a.close()

    // Another executor: another local directory, everything comes from the checkpoint.
    val b = newProvider(root, storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    def at(v: Long) = { val s = b.getReadStore(v); try contents(s) finally s.release() }
    assert(at(1) == Map(("a", 0) -> 1L, ("b", 0) -> 2L))
    assert(at(2) == Map(("b", 0) -> 2L, ("c", 0) -> 3L))
    assert(at(3) == Map(("b", 0) -> 20L, ("c", 0) -> 3L))
    val s = b.getStore(3)
    assert(s.get(key("b")).getLong(0) == 20L)
    assert(s.get(key("a")) == null)
    assert(s.keyExists(key("c")) && !s.keyExists(key("a")))
    assert(s.metrics.numKeys == 2)
    s.abort()
    b.close()
  }

  test("a restart on the same executor links files from the local cache; a new executor downloads") {
    val root = tempDir()
    val local = tempDir().getAbsolutePath
    val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      KeyedStateConf.Prefix + "localDir" -> local)
    val a = newProvider(root, conf)
    (0 until 4).foreach { v =>
      commitWith(a, v.toLong) { s => (0 until 500).foreach(i => s.put(key(s"v$v-$i"), value(i))) }
      a.awaitSnapshotUpload()
    }
    a.close()
    def loadMetrics(p: KeyedStateStoreProvider): Map[String, Long] = {
      val s = p.getStore(4)
      assert(contents(s).size == 2000)
      val m = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
      s.abort()
      p.close()
      m
    }
    val sameExecutor = loadMetrics(newProvider(root, conf))
    assert(sameExecutor("keyedstateLoadBytesDownloaded") == 0, sameExecutor)
    assert(sameExecutor("keyedstateLoadFilesReusedLocally") > 0, sameExecutor)
    val newExecutor = loadMetrics(newProvider(root,
      storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath)))
    assert(newExecutor("keyedstateLoadBytesDownloaded") > 0, newExecutor)
    assert(newExecutor("keyedstateLoadFilesReusedLocally") == 0, newExecutor)
  }

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


  test("an operator's declaration is committed with its version, carried on, and dropped by an abort") {
    import org.json4s._
    val root = tempDir()
    val p = newProvider(root)
    def declared(s: StateStore) = s.asInstanceOf[TaskStateStore].declaration
    def declare(s: StateStore, d: JValue): Unit = s.asInstanceOf[TaskStateStore].declare(d)
    val first = JObject("kind" -> JString("test"), "n" -> JInt(1))
    val second = JObject("kind" -> JString("test"), "n" -> JInt(2))
    commitWith(p, 0) { s => assert(declared(s).isEmpty); declare(s, first); s.put(key("a"), value(1)) }
    commitWith(p, 1)(_.put(key("b"), value(2))) // not declared again: carried on
    val aborted = p.getStore(2)
    declare(aborted, second)
    assert(declared(aborted).contains(second))
    aborted.abort()
    // The aborted declaration went with the instance: the version is reloaded as committed.
    val again = p.getStore(2)
    assert(declared(again).contains(first), declared(again))
    assert(again.asInstanceOf[TaskStateStore].loadedManifest.getName == "2.manifest")
    again.abort()
    val fresh = newProvider(root)
    Seq(1L, 2L).foreach { v =>
      val r = fresh.getReadStore(v)
      assert(r.asInstanceOf[TaskStateStore].declaration.contains(first), v)
      r.release()
    }
    val manifest = new File(root, "0/0/2.manifest")
    assert(manifest.exists())
    assert(io.keyedstate.checkpoint.VersionManifest.fromJson(
      new String(java.nio.file.Files.readAllBytes(manifest.toPath))).declaration.contains(first))
    val readOnly = fresh.getReadStore(2)
    intercept[IllegalStateException](readOnly.asInstanceOf[TaskStateStore].declare(second))
    readOnly.release()
    p.close(); fresh.close()
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

  for (changelog <- Seq(false, true)) {
    test(s"retention keeps the newest minBatchesToRetain versions and deletes every file they do not need (changelog=$changelog)") {
      val root = tempDir()
      val conf = storeConf("spark.sql.streaming.minBatchesToRetain" -> "3",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "4",
        KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString,
        KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0")
      val p = newProvider(root, conf)
      (0 until 10).foreach { v =>
        commitWith(p, v.toLong) { s => (0 until 200).foreach(i => s.put(key(s"v$v-$i"), value(i))) }
        p.awaitSnapshotUpload()
      }
      p.doCleanupMaintenance()
      val dir = partitionDir(root)
      val manifests = dir.listFiles().map(_.getName).filter(_.endsWith(".manifest")).sorted
      assert(manifests.toSeq == Seq("10.manifest", "8.manifest", "9.manifest"))
      val store = new checkpoint.CheckpointStore(new org.apache.hadoop.fs.Path(dir.getAbsolutePath),
        new org.apache.hadoop.conf.Configuration())
      val retained = Seq(8L, 9L, 10L).map(v => store.readManifest(v, None))
      if (changelog) {
        // A snapshot every 4 versions: 10 replays at most the changelogs since the last one.
        assert(retained.forall(m => m.snapshotVersion >= 4 && m.changelogs.size <= 5), retained)
      }
      val descriptors = store.listSnapshotDescriptors().map(store.readSnapshotDescriptor)
      assert(descriptors.forall(_.version >= retained.map(_.snapshotVersion).min), descriptors)
      val referenced = (retained.flatMap(_.allFiles) ++ descriptors.flatMap(_.files)).map(_.path).toSet
      val present = store.listDataFiles().map(_._1).toSet
      assert(present == referenced, s"unreferenced: ${present -- referenced}, missing: ${referenced -- present}")

      val fresh = newProvider(root, conf)
      Seq(8L, 9L, 10L).foreach { v =>
        val r = fresh.getReadStore(v)
        assert(contents(r).size == 200 * v)
        r.release()
      }
      val (condition, message) = sparkFailure(fresh.getReadStore(5))
      assert(condition.startsWith("CANNOT_LOAD_STATE_STORE."), condition)
      assert(message.contains("version 5") && message.contains("5.manifest"), message)
      p.close(); fresh.close()
    }
  }

  test("changelog and snapshot checkpointing give the same state at every version (random operations)") {
    val rnd = new scala.util.Random(42)
    val ops = (0 until 12).map { _ =>
      (0 until 300).map { _ =>
        (rnd.nextInt(10), s"k${rnd.nextInt(150)}", rnd.nextInt(1000).toLong)
      }
    }
    def runAll(changelog: Boolean): (File, Seq[Map[String, Any]]) = {
      val root = tempDir()
      val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "3",
        KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString)
      val p = newProvider(root, conf, useColumnFamilies = true)
      val states = ops.zipWithIndex.map { case (batch, v) =>
        val s = p.getStore(v.toLong)
        s.createColFamilyIfAbsent("multi", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
          useMultipleValuesPerKey = true)
        batch.foreach {
          case (op, k, x) if op < 5 => s.put(key(k), value(x))
          case (op, k, _) if op < 7 => s.remove(key(k))
          case (op, k, x) if op < 9 => s.merge(key(k), value(x), "multi")
          case (_, k, _) => s.remove(key(k), "multi")
        }
        if (v == 6) s.removeColFamilyIfExists("multi")
        val state = snapshotOf(s)
        s.commit()
        state
      }
      p.close()
      (root, states)
    }
    def snapshotOf(s: ReadStateStore): Map[String, Any] = {
      val multi =
        if (!s.allColumnFamilyNames.contains("multi")) Map.empty
        else {
          val it = s.iteratorWithMultiValues("multi")
          try it.map(pr => keyOf(pr.key)._1 -> pr.value.getLong(0)).toList.groupBy(_._1).map {
            case (k, vs) => k -> vs.map(_._2)
          } finally it.close()
        }
      Map("default" -> contents(s), "multi" -> multi)
    }
    val (snapRoot, viaSnapshots) = runAll(changelog = false)
    val (logRoot, viaChangelogs) = runAll(changelog = true)
    assert(viaChangelogs == viaSnapshots)
    // Every version also loads the same from the durable files alone.
    Seq(snapRoot -> false, logRoot -> true).foreach { case (root, changelog) =>
      val conf = storeConf(KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString)
      val fresh = newProvider(root, conf, useColumnFamilies = true)
      (1 to ops.size).foreach { v =>
        val s = fresh.getStore(v.toLong)
        s.createColFamilyIfAbsent("multi", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
          useMultipleValuesPerKey = true)
        val expected = viaSnapshots(v - 1)
        assert(contents(s) == expected("default"), s"version $v (changelog=$changelog)")
        s.abort()
      }
      fresh.close()
    }
  }

  test("a snapshot that finished after a run's last commit is the next run's base (chains stay short)") {
    val root = tempDir()
    val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0")
    // Six runs of one batch each (like availableNow jobs): no run commits after its snapshot.
    val replays = (0 until 6).map { v =>
      val p = newProvider(root, storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
        KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
      val s = p.getStore(v.toLong)
      val replayed = s.metrics.customMetrics.collectFirst {
        case (m, x) if m.name == "keyedstateLoadChangelogRecordsReplayed" => x
      }.get
      assert(contents(s).size == 100 * v)
      (0 until 100).foreach(i => s.put(key(s"v$v-$i"), value(i)))
      s.commit()
      p.awaitSnapshotUpload()
      p.doCleanupMaintenance()
      p.close()
      replayed
    }
    // Each load starts from the newest finished snapshot: at most 2 changelogs of 100 records.
    assert(replays.forall(_ <= 200), replays)
    val cleaner = newProvider(root, conf)
    cleaner.doCleanupMaintenance()
    cleaner.close()
    val store = new checkpoint.CheckpointStore(
      new org.apache.hadoop.fs.Path(partitionDir(root).getAbsolutePath), new org.apache.hadoop.conf.Configuration())
    val m6 = store.readManifest(6, None)
    val r = newProvider(root, storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    val s6 = r.getReadStore(6)
    assert(contents(s6).size == 600)
    s6.release(); r.close()
    assert(m6.changelogs.size <= 2, m6)
  }

  test("a bulk load is snapshotted at once: replaying it would cost more than loading the state") {
    val root = tempDir()
    val p = newProvider(root) // minDeltasForSnapshot: 10
    commitWith(p, 0) { s => (0 until 150000).foreach(i => s.put(key(s"k$i"), value(i))) }
    p.awaitSnapshotUpload()
    p.close()
    val fresh = newProvider(root, storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    val s = fresh.getStore(1)
    val m = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
    assert(m("keyedstateLoadChangelogRecordsReplayed") == 0, m)
    assert(s.metrics.numKeys == 150000)
    s.abort(); fresh.close()
  }

  test("changelog commits upload one small file; snapshots follow every minDeltasForSnapshot versions") {
    val root = tempDir()
    val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "3")
    val p = newProvider(root, conf)
    commitWith(p, 0) { s => (0 until 5000).foreach(i => s.put(key(s"k$i"), value(i))) }
    val metrics = (1 to 6).map { v =>
      val s = p.getStore(v.toLong)
      (0 until 10).foreach(i => s.put(key(s"k$i"), value(v)))
      s.commit()
      p.awaitSnapshotUpload()
      s.metrics.customMetrics.map { case (k, x) => k.name -> x }
    }
    metrics.foreach { m =>
      assert(m("keyedstateCommitFilesUploaded") == 1, m)
      assert(m("keyedstateCommitChangelogRecords") == 10, m)
      assert(m("keyedstateCommitBytesUploaded") < 2000, m)
    }
    // Snapshots are taken at versions 3 and 6; each one is the base of the next commit's manifest.
    val store = new checkpoint.CheckpointStore(
      new org.apache.hadoop.fs.Path(partitionDir(root).getAbsolutePath), new org.apache.hadoop.conf.Configuration())
    assert((1 to 7).map(v => store.readManifest(v, None).snapshotVersion) == Seq(0, 0, 0, 3, 3, 3, 6))
    assert(metrics(2)("keyedstateSnapshotBytesUploaded") > 0) // the commit of version 4
    p.close()
  }

  test("two attempts at one version never corrupt each other; the loser's files are orphans") {
    val root = tempDir()
    val conf = storeConf(KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0")
    val base = newProvider(root, conf)
    commitWith(base, 0)(_.put(key("a"), value(1)))
    val first = newProvider(root, conf)
    val second = newProvider(root, conf)
    val s1 = first.getStore(1)
    val s2 = second.getStore(1)
    s1.put(key("b"), value(2))
    s2.put(key("b"), value(3))
    s1.commit()
    s2.commit() // same version, format v1: the later manifest wins, each lists only its own files
    val reader = newProvider(root, conf)
    val r = reader.getReadStore(2)
    assert(contents(r) == Map(("a", 0) -> 1L, ("b", 0) -> 3L))
    r.release()
    // An orphan of a crashed upload, too old to belong to a commit in flight.
    val junk = new File(partitionDir(root), "shared/000099-deadbeef.sst")
    junk.getParentFile.mkdirs()
    java.nio.file.Files.write(junk.toPath, Array[Byte](1, 2, 3))
    // And a manifest whose writer died before renaming it into place.
    val deadManifest = new File(partitionDir(root), ".3.manifest.0b5e.tmp")
    java.nio.file.Files.write(deadManifest.toPath, Array[Byte](123))
    base.doCleanupMaintenance()
    assert(!junk.exists() && !deadManifest.exists())
    val again = newProvider(root, conf)
    val r2 = again.getReadStore(2)
    assert(contents(r2) == Map(("a", 0) -> 1L, ("b", 0) -> 3L))
    r2.release()
    Seq(base, first, second, reader, again).foreach(_.close())
  }

  test("files younger than the orphan grace period are left alone") {
    val root = tempDir()
    val p = newProvider(root) // default grace: 10 minutes
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val inflight = new File(partitionDir(root), "shared/000077-inflight.sst")
    inflight.getParentFile.mkdirs()
    java.nio.file.Files.write(inflight.toPath, Array[Byte](1))
    p.doCleanupMaintenance()
    assert(inflight.exists())
    p.close()
  }

  private def committedSst(root: File, version: Long): File = {
    val store = new checkpoint.CheckpointStore(
      new org.apache.hadoop.fs.Path(partitionDir(root).getAbsolutePath), new org.apache.hadoop.conf.Configuration())
    val entry = store.readManifest(version, None).files.find(_.localName.endsWith(".sst")).get
    new File(partitionDir(root), entry.path)
  }

  private val snapshotMode = storeConf(KeyedStateConf.Prefix + "changelogCheckpointing" -> "false")

  private def oneVersion(conf: StateStoreConf = snapshotMode): File = {
    val root = tempDir()
    val p = newProvider(root, conf)
    commitWith(p, 0) { s => (0 until 100).foreach(i => s.put(key(s"k$i"), value(i))) }
    p.close()
    root
  }

  private def condition(e: Throwable): String = e match {
    case spark: org.apache.spark.SparkThrowable => spark.getCondition
    case other => fail(s"not a Spark error: $other")
  }

  /** A failure's Spark error condition, and keyedstate's own message found among its causes. */
  private def sparkFailure(f: => Any): (String, String) = {
    val e = intercept[Exception](f)
    val ours = Iterator.iterate[Throwable](e)(_.getCause).takeWhile(_ != null)
      .collectFirst { case c: CheckpointFileException => c }
      .getOrElse(fail(s"no keyedstate message under $e"))
    // Spark's class outside, keyedstate's identifier first in its own line.
    assert(ours.getMessage == s"[${ours.errorId}] ${ours.detail}", ours.getMessage)
    assert(ErrorId.named(ours.errorId).exists(_.family == ErrorFamily.Checkpoint), ours.errorId)
    (condition(e), ours.getMessage)
  }

  /** Loads on a new executor (its own local directory, so nothing comes from a local cache). */
  private def assertLoadFails(root: File, version: Long, mustMention: String*): Unit =
    assertLoadFailsWith(root, version, Map.empty, "", mustMention: _*)

  /** A load that fails with Spark's `CANNOT_LOAD_STATE_STORE.<subCondition>`. */
  private def assertLoadFailsAs(subCondition: String, root: File, version: Long, mustMention: String*): Unit =
    assertLoadFailsWith(root, version, Map.empty, subCondition, mustMention: _*)

  private def assertLoadFailsWith(root: File, version: Long, settings: Map[String, String], subCondition: String,
      mustMention: String*): Unit = {
    val p = newProvider(root, storeConf((Seq(KeyedStateConf.Prefix + "changelogCheckpointing" -> "false",
      KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath) ++ settings): _*))
    val (condition, message) = sparkFailure(p.getStore(version))
    assert(condition.startsWith("CANNOT_LOAD_STATE_STORE." + subCondition), condition)
    mustMention.foreach(m => assert(message.contains(m), s"'$message' should mention '$m'"))
    p.close()
  }

  test("a truncated state file fails the load, naming the file and the version") {
    val root = oneVersion()
    val sst = committedSst(root, 1)
    val raf = new RandomAccessFile(sst, "rw")
    try raf.setLength(sst.length() / 2) finally raf.close()
    new File(sst.getParentFile, s".${sst.getName}.crc").delete()
    assertLoadFailsAs("UNEXPECTED_FILE_SIZE", root, 1, sst.getName, "version 1", "damaged")
  }

  test("a deleted state file fails the load, naming the file and the version") {
    val root = oneVersion()
    val sst = committedSst(root, 1)
    assert(sst.delete())
    // Spark's condition as its RocksDB provider raises it, naming the file.
    assertLoadFailsAs("CANNOT_READ_STREAMING_STATE_FILE", root, 1, sst.getName, "version 1", "missing")
  }

  test("a state file with flipped bytes fails the checksum, naming the file and the version") {
    val root = oneVersion()
    val sst = committedSst(root, 1)
    val raf = new RandomAccessFile(sst, "rw")
    try { raf.seek(10); val b = raf.read(); raf.seek(10); raf.write(b ^ 0xff) } finally raf.close()
    // Hadoop's local checksum side file catches it first ...
    assertLoadFails(root, 1, sst.getName, "version 1", "corrupt")
    // ... and on a file system without one, the manifest's CRC32C does.
    new File(sst.getParentFile, s".${sst.getName}.crc").delete()
    assertLoadFails(root, 1, sst.getName, "version 1", "CRC32C")
  }

  test("a truncated or corrupt changelog fails the load, naming it and the version") {
    val root = oneVersion(storeConf())
    val log = new File(partitionDir(root), "changelog").listFiles().filter(_.getName.endsWith(".changelog")).head
    val crc = new File(log.getParentFile, s".${log.getName}.crc")
    val raf = new RandomAccessFile(log, "rw")
    try raf.setLength(log.length() - 7) finally raf.close()
    crc.delete()
    assertLoadFails(root, 1, log.getName, "version 1", "damaged")
    // The same bytes count but different content: the CRC32C in the manifest catches it.
    val other = oneVersion(storeConf())
    val log2 = new File(partitionDir(other), "changelog").listFiles().filter(_.getName.endsWith(".changelog")).head
    val raf2 = new RandomAccessFile(log2, "rw")
    try { raf2.seek(20); val b = raf2.read(); raf2.seek(20); raf2.write(b ^ 0x5a) } finally raf2.close()
    new File(log2.getParentFile, s".${log2.getName}.crc").delete()
    assertLoadFails(other, 1, log2.getName, "version 1", "CRC32C")
  }

  private def onlyChangelog(root: File): File =
    new File(partitionDir(root), "changelog").listFiles().filter(_.getName.endsWith(".changelog")).head

  test("a damaged compressed changelog fails the load naming it and the version, even with checksums off") {
    for (codec <- Seq("lz4", "zstd")) {
      val root = oneVersion(storeConf(KeyedStateConf.Prefix + "changelogCompression" -> codec))
      val log = onlyChangelog(root)
      val raf = new RandomAccessFile(log, "rw")
      try { val at = log.length() / 2; raf.seek(at); val b = raf.read(); raf.seek(at); raf.write(b ^ 0x5a) }
      finally raf.close()
      new File(log.getParentFile, s".${log.getName}.crc").delete()
      // The size is right and the manifest's CRC32C is not checked: the codec's own check catches it.
      assertLoadFailsWith(root, 1, Map(KeyedStateConf.Prefix + "verifyChecksumsOnLoad" -> "false"), "",
        log.getName, "version 1", "damaged")
    }
  }

  test("each changelog records its codec: stores written with one codec load and continue with another") {
    val root = tempDir()
    val codecs = Seq("zstd", "lz4", "none", "zstd")
    codecs.zipWithIndex.foreach { case (codec, v) =>
      // Each version on a new executor with another codec setting: it replays the others' changelogs.
      val p = newProvider(root, storeConf(KeyedStateConf.Prefix + "changelogCompression" -> codec,
        KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
      commitWith(p, v) { s => (0 until 50).foreach(i => s.put(key(s"k$i", v), value(i * 10 + v))) }
      p.close()
    }
    val logs = new File(partitionDir(root), "changelog").listFiles().filter(_.getName.endsWith(".changelog"))
      .sortBy(_.getName.takeWhile(_ != '-').toLong)
    assert(logs.map(f => java.nio.file.Files.readAllBytes(f.toPath)(5)).toSeq == Seq[Byte](2, 1, 0, 2))
    val p = newProvider(root, storeConf(KeyedStateConf.Prefix + "changelogCompression" -> "lz4",
      KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    val s = p.getReadStore(codecs.size.toLong)
    try assert(contents(s) == codecs.indices.flatMap(v => (0 until 50).map(i => (s"k$i", v) -> (i * 10L + v))).toMap)
    finally { s.release(); p.close() }
  }

  test("a truncated or missing manifest fails the load, naming it and the version") {
    val root = oneVersion()
    val manifest = new File(partitionDir(root), "1.manifest")
    val raf = new RandomAccessFile(manifest, "rw")
    try raf.setLength(40) finally raf.close()
    new File(manifest.getParentFile, ".1.manifest.crc").delete()
    assertLoadFails(root, 1, "1.manifest", "version 1", "corrupt")
    assert(manifest.delete())
    assertLoadFails(root, 1, "1.manifest", "version 1", "missing")
  }

  test("checkpoint format v2: each commit has an id, and loads pick the commit by id") {
    val root = tempDir()
    val conf = storeConf("spark.sql.streaming.stateStore.checkpointFormatVersion" -> "2")
    val p = newProvider(root, conf)
    val s0 = p.getStore(0)
    s0.put(key("a"), value(1))
    s0.commit()
    val info1 = s0.getStateStoreCheckpointInfo()
    assert(info1.batchVersion == 1 && info1.stateStoreCkptId.isDefined && info1.baseStateStoreCkptId.isEmpty)
    val attempts = (1 to 2).map { n =>
      val q = newProvider(root, conf)
      val s = q.getStore(1, info1.stateStoreCkptId)
      s.put(key("b"), value(n))
      s.commit()
      val info = s.getStateStoreCheckpointInfo()
      assert(info.baseStateStoreCkptId == info1.stateStoreCkptId)
      q.close()
      n -> info.stateStoreCkptId
    }
    attempts.foreach { case (n, id) =>
      val q = newProvider(root, conf)
      val r = q.getReadStore(2, id)
      assert(contents(r) == Map(("a", 0) -> 1L, ("b", 0) -> n.toLong))
      r.release(); q.close()
    }
    val q = newProvider(root, conf)
    assert(sparkFailure(q.getStore(2))._2.contains("2 commits"))
    q.close(); p.close()
  }

  test("load failures are Spark's CANNOT_LOAD_STATE_STORE errors, keyedstate's message (path, version) the cause") {
    val root = tempDir()
    val p = newProvider(root)
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val negative = intercept[Exception](p.getStore(-1))
    assert(condition(negative) == "CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION", negative)
    val missingVersion = intercept[Exception](p.getReadStore(7))
    // Spark's condition for a missing state file, `fileToRead` the manifest.
    assert(condition(missingVersion) == "CANNOT_LOAD_STATE_STORE.CANNOT_READ_STREAMING_STATE_FILE", missingVersion)
    assert(missingVersion.getMessage.contains("7.manifest"), missingVersion.getMessage)
    val (_, message) = sparkFailure(p.getReadStore(7))
    assert(message.contains("version 7") && message.contains("7.manifest") && message.contains(root.getAbsolutePath),
      message)
    // The provider still serves the versions it has.
    val r = p.getReadStore(1)
    assert(contents(r) == Map(("a", 0) -> 1L))
    r.release(); p.close()
  }

  test("a partition held by another task past the wait is Spark's UNRELEASED_THREAD_ERROR, keyedstate's STORE_BUSY the cause") {
    // The two-minute wait itself is not run here: the mapping of its failure is.
    val busy = KeyedStateErrors.storeBusy("Timed out after 2 minutes waiting for state store s", "task-7", 120000)
    val e = KeyedStateErrors.cannotLoad(StateStoreId("/cp", 0, 3), 5, busy)
    assert(condition(e) == "CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR", e)
    assert(e.getMessage.contains("task-7") && e.getMessage.contains("120000"), e.getMessage)
    val ours = KeyedStateError.find(e).get
    assert(ours.error == ErrorId.StoreBusy && !ours.isInstanceOf[CheckpointFileException], ours)
    assert(ours.getMessage.startsWith("[KEYEDSTATE_STORE_BUSY] Cannot load version 5 of state store"), ours.getMessage)
  }

  test("a file system whose rename reports failure fails the commit with CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT") {
    val dir = tempDir()
    val hadoopConf = new org.apache.hadoop.conf.Configuration()
    hadoopConf.set("fs.renamefails.impl", classOf[RenameReturnsFalseFileSystem].getName)
    hadoopConf.setBoolean("fs.renamefails.impl.disable.cache", true)
    val p = new KeyedStateStoreProvider
    p.init(StateStoreId(s"renamefails://${dir.getAbsolutePath}", 0, 0), keySchema, valueSchema,
      NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false, storeConf(), hadoopConf, false, None)
    val s = p.getStore(0)
    s.put(key("a"), value(1))
    val (condition, message) = sparkFailure(s.commit())
    assert(condition == "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT", condition)
    assert(message.contains("version 1") && message.contains("manifest"), message)
    assert(!new File(partitionDir(dir), "1.manifest").exists())
    p.close()
  }

  test("on an object store (abortable streams, no atomic rename) a rewritten manifest is replaced in place, never removed first") {
    val dir = tempDir()
    val hadoopConf = new org.apache.hadoop.conf.Configuration()
    hadoopConf.set("fs.objstore.impl", classOf[ObjectStoreLikeFileSystem].getName)
    hadoopConf.setBoolean("fs.objstore.impl.disable.cache", true)
    def provider(): KeyedStateStoreProvider = {
      val p = new KeyedStateStoreProvider
      p.init(StateStoreId(s"objstore://${dir.getAbsolutePath}", 0, 0), keySchema, valueSchema,
        NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false, storeConf(), hadoopConf, false, None)
      p
    }
    ObjectStoreLikeFileSystem.reset()
    val first = provider()
    commitWith(first, 0)(_.put(key("a"), value(1)))
    first.close()
    // A second attempt at version 1 (a retried or speculative task) writes 1.manifest again.
    val second = provider()
    commitWith(second, 0)(_.put(key("a"), value(2)))
    second.close()
    assert(ObjectStoreLikeFileSystem.manifestRenamesOrDeletes.isEmpty, ObjectStoreLikeFileSystem.manifestRenamesOrDeletes)
    assert(ObjectStoreLikeFileSystem.manifestWrites.get() == 2)
    // A third attempt whose manifest write fails is aborted: the committed manifest stays.
    ObjectStoreLikeFileSystem.failManifestWrites = true
    val third = provider()
    val s = third.getStore(0)
    s.put(key("a"), value(3))
    val (condition, _) = sparkFailure(s.commit())
    assert(condition == "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT", condition)
    third.close()
    ObjectStoreLikeFileSystem.failManifestWrites = false
    val reader = provider()
    val r = reader.getReadStore(1)
    assert(contents(r) == Map(("a", 0) -> 2L))
    r.release(); reader.close()
  }

  test("loadEmpty starts a version from nothing") {
    val root = tempDir()
    val p = newProvider(root)
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val s = p.getStore(7, None, forceSnapshotOnCommit = false, loadEmpty = true)
    assert(contents(s).isEmpty)
    s.put(key("z"), value(26))
    assert(s.commit() == 8)
    val q = newProvider(root)
    val r = q.getReadStore(8)
    assert(contents(r) == Map(("z", 0) -> 26L))
    r.release(); p.close(); q.close()
  }

  test("snapshot commits upload only new files and report their phases") {
    val p = newProvider(tempDir(), snapshotMode)
    commitWith(p, 0) { s => (0 until 1000).foreach(i => s.put(key(s"k$i"), value(i))) }
    val s = p.getStore(1)
    s.put(key("one-more"), value(1))
    s.commit()
    val m = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
    assert(m("keyedstateCommitFilesReused") >= 1, m)
    assert(m("keyedstateCommitFilesUploaded") >= 1, m)
    assert(m("keyedstateCommitBytesUploaded") > 0, m)
    assert(KeyedStateMetricsNames.all.forall(m.contains), m)
    p.close()
  }

  test("an invalid option names the key, the value and what is allowed") {
    val bad = intercept[IllegalArgumentException] {
      newProvider(tempDir(), storeConf(KeyedStateConf.Prefix + "compression" -> "brotli"))
    }
    assert(bad.getMessage.contains("spark.sql.streaming.stateStore.keyedstate.compression"))
    assert(bad.getMessage.contains("brotli") && bad.getMessage.contains("zstd"))
    val neg = intercept[IllegalArgumentException] {
      newProvider(tempDir(), storeConf(KeyedStateConf.Prefix + "transferThreads" -> "0"))
    }
    assert(neg.getMessage.contains("transferThreads") && neg.getMessage.contains("'0'") &&
      neg.getMessage.contains("from 1 to 256"))
    val unknown = intercept[IllegalArgumentException] {
      newProvider(tempDir(), storeConf(KeyedStateConf.Prefix + "blockCacheSize" -> "5"))
    }
    assert(unknown.getMessage.contains("blockCacheSize") && unknown.getMessage.contains("blockCacheSizeMB"))
  }
}

/** A local file system whose rename reports failure, as Spark's own test file system does. */
class RenameReturnsFalseFileSystem extends org.apache.hadoop.fs.RawLocalFileSystem {
  override def getUri: java.net.URI = java.net.URI.create("renamefails:///")
  override def rename(src: org.apache.hadoop.fs.Path, dst: org.apache.hadoop.fs.Path): Boolean = false
}

/**
 * A local file system that behaves like an object store for the files the provider replaces
 * (manifests and snapshot descriptors): it reports abortable output streams, a written file
 * appears whole when its stream closes and not at all when the stream is aborted. It records
 * every rename or delete of such a file (an object store's rename deletes the target first).
 */
class ObjectStoreLikeFileSystem extends org.apache.hadoop.fs.RawLocalFileSystem {
  import org.apache.hadoop.fs.{CommonPathCapabilities, FSDataOutputStream, Path}

  override def getUri: java.net.URI = java.net.URI.create("objstore:///")

  override def hasPathCapability(path: Path, capability: String): Boolean =
    capability == CommonPathCapabilities.ABORTABLE_STREAM || super.hasPathCapability(path, capability)

  private def replaced(path: Path): Boolean =
    path.getName.endsWith(".manifest") || path.getName.endsWith(".snapshot")

  override def rename(src: Path, dst: Path): Boolean = {
    if (replaced(dst)) ObjectStoreLikeFileSystem.manifestRenamesOrDeletes.add(s"rename $src $dst")
    super.rename(src, dst)
  }

  override def delete(path: Path, recursive: Boolean): Boolean = {
    if (replaced(path)) ObjectStoreLikeFileSystem.manifestRenamesOrDeletes.add(s"delete $path")
    super.delete(path, recursive)
  }

  override def create(path: Path, overwrite: Boolean, bufferSize: Int, replication: Short,
      blockSize: Long, progress: org.apache.hadoop.util.Progressable): FSDataOutputStream =
    if (!replaced(path)) super.create(path, overwrite, bufferSize, replication, blockSize, progress)
    else {
      ObjectStoreLikeFileSystem.manifestWrites.incrementAndGet()
      val target = pathToFile(path).toPath
      new FSDataOutputStream(new ObjectStoreLikeFileSystem.PublishOnClose(target), null)
    }
}

object ObjectStoreLikeFileSystem {
  val manifestRenamesOrDeletes = new java.util.concurrent.ConcurrentLinkedQueue[String]()
  val manifestWrites = new java.util.concurrent.atomic.AtomicInteger()
  @volatile var failManifestWrites = false

  def reset(): Unit = { manifestRenamesOrDeletes.clear(); manifestWrites.set(0); failManifestWrites = false }

  /** Buffers the object; `close` publishes it whole (an atomic move), `abort` drops it. */
  final class PublishOnClose(target: java.nio.file.Path)
      extends java.io.ByteArrayOutputStream with org.apache.hadoop.fs.Abortable {
    private var done = false
    override def write(b: Array[Byte], off: Int, len: Int): Unit = {
      if (failManifestWrites) throw new java.io.IOException(s"injected: the upload of $target failed")
      super.write(b, off, len)
    }
    override def close(): Unit = if (!done) {
      done = true
      val tmp = java.nio.file.Files.createTempFile(target.getParent, ".upload", ".tmp")
      java.nio.file.Files.write(tmp, toByteArray)
      java.nio.file.Files.move(tmp, target, java.nio.file.StandardCopyOption.ATOMIC_MOVE,
        java.nio.file.StandardCopyOption.REPLACE_EXISTING)
    }
    override def abort(): org.apache.hadoop.fs.Abortable.AbortableResult = {
      done = true
      new org.apache.hadoop.fs.Abortable.AbortableResult {
        override def alreadyClosed(): Boolean = false
        override def anyCleanupException(): java.io.IOException = null
      }
    }
  }
}

object KeyedStateMetricsNames {
  val all: Seq[String] = io.keyedstate.metrics.KeyedStateMetrics.all.map(_.name)
}
