package io.keyedstate.rocks

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.Files

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.LocalFiles
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.Eventually.eventually

/**
 * Point reads (keyMayExist first, `get` as the fallback) return exactly what `get` would; prefix
 * scans (a reused iterator) see every write made before them; so does everything that reads the
 * database or its files while writes wait in the batch.
 */
class LocalRocksDBSuite extends AnyFunSuite {
  private def b(s: String): Array[Byte] = s.getBytes(UTF_8)

  test("a flush started in the background while RocksDB has stopped writes is skipped, not a failure") {
    val dir = Files.createTempDirectory("keyedstate-rocks").toFile
    val db = LocalRocksDB.open(dir, KeyedStateConf.fromMap(Map.empty))
    try {
      val cf = LocalRocksDB.DefaultColumnFamily
      // Level 0 at its stop trigger, below the compaction trigger (8): what level-0 files coming
      // faster than a busy machine compacts them reach (a CI run's commit failed with "Writes
      // have been stopped").
      db.setOptionsForTest(cf, org.rocksdb.MutableColumnFamilyOptions.builder()
        .setLevel0SlowdownWritesTrigger(2).setLevel0StopWritesTrigger(2).build())
      (1 to 2).foreach { i =>
        db.put(cf, b(s"k$i"), b(s"v$i"))
        db.scan(cf, None, None).close() // a scan writes the buffer into the memtable: flushed to level 0
        db.flush()
      }
      // The commit before a snapshot: nothing buffered, a flush that does not wait (not started).
      assert(!db.flushInBackground())
      db.put(cf, b("k3"), b("v3"))
      db.flushInBackground() // a buffer to spill: ingested, then the same flush on the spill thread
      assert(new String(db.get(cf, b("k3")), UTF_8) == "v3") // waits for the spill
      assert(db.healthy)
      // Writes resumed: a flush that waits goes through.
      db.setOptionsForTest(cf, org.rocksdb.MutableColumnFamilyOptions.builder()
        .setLevel0SlowdownWritesTrigger(20).setLevel0StopWritesTrigger(36).build())
      db.flush()
      assert((1 to 3).map(i => new String(db.get(cf, b(s"k$i")), UTF_8)) == Seq("v1", "v2", "v3"))
    } finally {
      db.close()
      LocalFiles.deleteRecursively(dir)
    }
  }

  test("point reads: missing and found keys, values of every size, merges, in memtables, SST files and after a reopen") {
    val dir = Files.createTempDirectory("keyedstate-rocks").toFile
    val conf = KeyedStateConf.fromMap(Map.empty)
    val cf = LocalRocksDB.DefaultColumnFamily
    // Around the 16 KiB read buffer and its 1 MiB limit.
    val sizes = Seq(0, 1, 40, 16 * 1024, 16 * 1024 + 1, 100 * 1024, 3 * 1024 * 1024)
    val values = sizes.map(n => s"v$n" -> Array.tabulate[Byte](n)(i => (i * 31 + n).toByte)).toMap
    def check(db: LocalRocksDB, merged: String): Unit = (1 to 2).foreach { _ => // the 2nd read hits cached blocks
      values.foreach { case (k, v) => assert(java.util.Arrays.equals(db.get(cf, b(k)), v), k) }
      assert(db.get(cf, b("missing")) == null && db.get(cf, b("deleted")) == null)
      assert(new String(db.get(cf, b("m")), UTF_8) == merged)
    }
    try {
      var db = LocalRocksDB.open(dir, conf)
      values.foreach { case (k, v) => db.put(cf, b(k), v) }
      db.put(cf, b("deleted"), b("x")); db.delete(cf, b("deleted"))
      db.put(cf, b("m"), b("a")); db.merge(cf, b("m"), b("b"))
      check(db, "ab")
      db.flush()
      check(db, "ab")
      db.close()
      db = LocalRocksDB.open(dir, conf) // nothing cached: reads fall back to get where needed
      db.merge(cf, b("m"), b("c")) // an operand in the memtable over a base in an SST file
      check(db, "abc")
      db.close()
    } finally LocalFiles.deleteRecursively(dir)
  }

  test("buffered writes that fail to go into RocksDB fail every later read, write and commit, in any thread") {
    // Some of them may be in RocksDB and some not (a merge's operands may be in both): reads
    // would be wrong, so the instance refuses everything and the provider rebuilds it.
    val injected = new RuntimeException("no space left on device (injected)")
    def failing(setUp: LocalRocksDB => Unit): Unit = {
      val dir = Files.createTempDirectory("keyedstate-rocks").toFile
      val db = LocalRocksDB.open(dir, KeyedStateConf.fromMap(Map.empty))
      val cf = LocalRocksDB.DefaultColumnFamily
      try {
        db.put(cf, b("k"), b("old")); db.flush()
        db.put(cf, b("k"), b("new")); db.merge(cf, b("m"), b("+"))
        db.testHooks.spillFault = injected
        setUp(db)
        assert(!db.healthy)
        val later: Seq[() => Any] = Seq(() => db.get(cf, b("k")), () => db.get(cf, b("other")),
          () => db.exists(cf, b("other")), () => db.put(cf, b("x"), b("1")), () => db.throwIfWritesLost(),
          () => db.flush(), () => db.flushInBackground(), () => db.scan(cf, None, None))
        later.foreach(op => assert(intercept[Exception](op()) eq injected))
      } finally { db.close(); LocalFiles.deleteRecursively(dir) }
    }
    // In the background, after the commit before a snapshot froze the buffer.
    failing { db => db.flushInBackground(); eventually(!db.healthy) }
    // In the maintenance thread, whose scan (TTL's background cleanup) writes the buffer in first.
    failing { db =>
      var met: Throwable = null
      val maintenance = new Thread(() => met = intercept[Exception](db.scan(LocalRocksDB.DefaultColumnFamily, None, None)))
      maintenance.start(); maintenance.join()
      assert(met eq injected)
    }
  }


  test("prefix scans see every write before them, nest, and end at the prefix, with a reused iterator") {
    val dir = Files.createTempDirectory("keyedstate-rocks").toFile
    val conf = KeyedStateConf.fromMap(Map.empty)
    val db = LocalRocksDB.open(dir, conf)
    def scan(cf: String, prefix: String): Seq[String] = {
      val it = db.prefixScan(cf, b(prefix))
      try it.map { case (k, v) => new String(k, UTF_8) + "=" + new String(v, UTF_8) }.toList finally it.close()
    }
    try {
      db.createColumnFamily("cf")
      Seq("a1", "a2", "b1", "b2", "b3", "c1").foreach(k => db.put("cf", b(k), b("1")))
      assert(scan("cf", "b") === Seq("b1=1", "b2=1", "b3=1"))
      assert(scan("cf", "a") === Seq("a1=1", "a2=1"))
      assert(scan("cf", "d").isEmpty && scan("cf", "c") === Seq("c1=1"))
      // Every kind of write between two scans is seen by the second.
      db.put("cf", b("b2"), b("2")); db.delete("cf", b("b1")); db.merge("cf", b("b4"), b("m"))
      assert(scan("cf", "b") === Seq("b2=2", "b3=1", "b4=m"))
      db.deleteRange("cf", b("b3"), b("b4"))
      assert(scan("cf", "b") === Seq("b2=2", "b4=m"))
      db.put("cf", b("b5"), b("5")); db.put("cf", b("b6"), b("6")); db.delete("cf", b("b6"))
      assert(scan("cf", "b") === Seq("b2=2", "b4=m", "b5=5"))
      db.flush()
      assert(scan("cf", "b") === Seq("b2=2", "b4=m", "b5=5"))
      // A scan inside another scan of the same family, and one left open, then the store's end.
      val outer = db.prefixScan("cf", b("a"))
      assert(new String(outer.next()._1, UTF_8) == "a1")
      assert(scan("cf", "b").size == 3)
      assert(new String(outer.next()._1, UTF_8) == "a2" && !outer.hasNext)
      outer.close()
      // Released (a commit) during a scan: the scan goes on, a new scan gets a new iterator.
      val open = db.prefixScan("cf", b("b"))
      assert(new String(open.next()._1, UTF_8) == "b2")
      db.releaseScanIterators()
      db.put("cf", b("a3"), b("3"))
      assert(scan("cf", "a") === Seq("a1=1", "a2=1", "a3=3"))
      assert(open.toList.map(kv => new String(kv._1, UTF_8)) === Seq("b4", "b5"))
      // A family dropped and created again: a scan of it sees the new, empty one.
      db.dropColumnFamily("cf"); db.createColumnFamily("cf")
      assert(scan("cf", "b").isEmpty)
    } finally { db.close(); LocalFiles.deleteRecursively(dir) }
  }

  test("batched writes: reads, scans, properties, flushes and checkpoints see every write before them") {
    val dir = Files.createTempDirectory("keyedstate-rocks").toFile
    val conf = KeyedStateConf.fromMap(Map.empty)
    val db = LocalRocksDB.open(new java.io.File(dir, "db"), conf)
    def str(v: Array[Byte]): String = if (v == null) null else new String(v, UTF_8)
    try {
      db.createColumnFamily("cf"); db.createColumnFamily("gone")
      // More writes than one batch holds, of every kind, with no read between them.
      val n = 10000
      (0 until n).foreach { i =>
        db.put("cf", b(f"k$i%05d"), b(s"v$i"))
        if (i % 3 == 0) db.merge("cf", b(f"k$i%05d"), b("+"))
        if (i % 7 == 0) db.delete("cf", b(f"k$i%05d"))
      }
      db.deleteRange("cf", b("k09990"), b("k09995"))
      // The range delete wrote the family's buffered writes in: the last of each key, and the range.
      assert(db.unflushedEntries == n + 1)
      // A range that ends where or before it begins is empty (RocksDB refuses it; Lincheck found it).
      db.deleteRange("cf", b("k00005"), b("k00001"))
      db.deleteRange("cf", b("k00005"), b("k00005"))
      assert(str(db.get("cf", b("k00005"))) == "v5")
      Seq(0, 1, 3, 7, 21, 4095, 4096, 4097, 9989, 9990, 9994, 9995, 9999).foreach { i =>
        val expected = if (i % 7 == 0 || (i >= 9990 && i < 9995)) null else s"v$i${if (i % 3 == 0) "+" else ""}"
        assert(str(db.get("cf", b(f"k$i%05d"))) == expected, i)
      }
      // A read, then writes: the first goes in alone, the rest wait; a scan sees both.
      db.put("cf", b("k99998"), b("a")); db.put("cf", b("k99999"), b("b"))
      val scanned = { val it = db.prefixScan("cf", b("k9999")); try it.map(kv => str(kv._1)).toList finally it.close() }
      assert(scanned === Seq("k99998", "k99999"))
      val all = db.scan("cf", None, None)
      try assert(all.size == n - (n + 6) / 7 - 5 + 2) finally all.close() // the range: k09990-k09994, none a multiple of 7
      // Writes waiting for a family that is dropped go with it; the others stay.
      db.put("gone", b("x"), b("1")); db.put("gone", b("y"), b("2")); db.put("cf", b("after"), b("3"))
      db.dropColumnFamily("gone")
      db.createColumnFamily("gone")
      assert(db.get("gone", b("y")) == null && str(db.get("cf", b("after"))) == "3")
      // A checkpoint and a flush hold what waited.
      db.put("cf", b("late1"), b("4")); db.put("cf", b("late2"), b("5"))
      db.checkpoint(new java.io.File(dir, "cp"))
      db.put("cf", b("late3"), b("6")); db.put("cf", b("late4"), b("7"))
      db.flush()
      assert(db.unflushedEntries == 0)
      val copy = LocalRocksDB.open(new java.io.File(dir, "cp"), conf)
      try {
        assert(str(copy.get("cf", b("late2"))) == "5" && copy.get("cf", b("late4")) == null)
        assert(str(copy.get("cf", b("k00001"))) == "v1")
      } finally copy.close()
      assert(str(db.get("cf", b("late4"))) == "7")
    } finally { db.close(); LocalFiles.deleteRecursively(dir) }
  }

  /**
   * Random writes of every kind to few keys of three families, checked against a model: reads
   * now and then, and every `freezeEvery` writes the commit before a snapshot's freeze, with reads
   * of what it froze (a merge's among them) while it goes into RocksDB in the background.
   */
  private def randomWrites(conf: KeyedStateConf, valueBytes: Int, freezeEvery: Int): Unit = {
    val dir = Files.createTempDirectory("keyedstate-rocks").toFile
    val inJvmBefore = LocalRocksDB.bufferedBytesInJvm
    val db = LocalRocksDB.open(new java.io.File(dir, "db"), conf)
    def str(v: Array[Byte]): String = if (v == null) null else new String(v, UTF_8)
    val families = Seq(LocalRocksDB.DefaultColumnFamily, "a", "b")
    // The model: what each family holds after every write, in the order made.
    val model = families.map(_ -> scala.collection.mutable.TreeMap[String, String]()).toMap
    val random = new scala.util.Random(42)
    val padding = "x" * valueBytes
    def check(cf: String, k: String, when: String): Unit = {
      assert(str(db.get(cf, b(k))) == model(cf).get(k).orNull, s"$cf $k $when")
      assert(db.exists(cf, b(k)) == model(cf).contains(k), s"$cf $k exists $when")
    }
    try {
      families.tail.foreach(db.createColumnFamily)
      (0 until 20000).foreach { i =>
        val cf = families(random.nextInt(families.size))
        val key = f"k${random.nextInt(300)}%03d" // few keys: many writes of one key in one batch
        val m = model(cf)
        random.nextInt(40) match {
          case n if n < 20 => db.put(cf, b(key), b(s"v$i$padding")); m(key) = s"v$i$padding"
          case n if n < 32 => db.merge(cf, b(key), b(s"+$i")); m(key) = m.getOrElse(key, "") + s"+$i"
          case n if n < 38 => db.delete(cf, b(key)); m.remove(key)
          case 38 =>
            val (from, to) = { val x = random.nextInt(300); val y = random.nextInt(300); (x min y, x max y) }
            db.deleteRange(cf, b(f"k$from%03d"), b(f"k$to%03d"))
            m.keys.filter(k => k >= f"k$from%03d" && k < f"k$to%03d").toList.foreach(m.remove)
          case _ =>
            val prefix = f"k${random.nextInt(30)}%02d"
            val it = db.prefixScan(cf, b(prefix))
            try assert(it.map { case (k, v) => str(k) -> str(v) }.toList == m.toList.filter(_._1.startsWith(prefix)))
            finally it.close()
        }
        if (i % 500 == 499) check(cf, f"k${random.nextInt(300)}%03d", s"after write $i")
        if (i % freezeEvery == freezeEvery - 1) {
          db.flushInBackground()
          model(cf).keys.take(5).foreach(k => check(cf, k, s"while write $i's buffer goes in"))
        }
      }
      db.flush() // every buffer in RocksDB: none of their bytes is counted any more
      assert(LocalRocksDB.bufferedBytesInJvm == inJvmBefore, "the JVM's total after the buffers went in")
      families.foreach { cf =>
        model(cf).keys.foreach(k => check(cf, k, "at the end"))
        val it = db.scan(cf, None, None)
        try assert(it.map { case (k, v) => str(k) -> str(v) }.toList == model(cf).toList, cf) finally it.close()
      }
    } finally { db.close(); LocalFiles.deleteRecursively(dir) }
    assert(LocalRocksDB.bufferedBytesInJvm == inJvmBefore, "a closed instance's buffers leave the JVM's total")
  }

  test("random writes of every kind, many of one key: each key reads as its writes in order leave it") {
    randomWrites(KeyedStateConf.fromMap(Map.empty), valueBytes = 0, freezeEvery = 7000)
  }

  test("random writes past the heap's bound: the buffer goes into RocksDB early, reads and scans agree") {
    // 1 MB for the JVM's buffers, values of 1 KB: spilled every few hundred writes.
    val conf = KeyedStateConf.fromMap(Map(KeyedStateConf.Prefix + "heapWriteBufferMB" -> "1"))
    randomWrites(conf, valueBytes = 1024, freezeEvery = 1500)
  }
}
