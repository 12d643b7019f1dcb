package io.keyedstate.bench

import java.io.File
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, NoPrefixKeyStateEncoderSpec, PrefixKeyScanStateEncoderSpec, StateStore, StateStoreConf, StateStoreId}
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.rocksdb.{ColumnFamilyDescriptor, ColumnFamilyHandle, FlushOptions, ReadOptions, RocksDB, WriteOptions}

import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.checkpoint.LocalFiles
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.{ColumnFamilyCodec, LocalRocksDB, RocksDBResources}

/**
 * Per-operation overhead (issue 13): each `StateStore` call as Spark's operators make it (provider
 * `init`, `getStore(version)`, `UnsafeRow` keys and values, default settings: changelog
 * checkpointing and exact key counts on) against the RocksDB call it needs, made directly on a raw
 * `rocksdbjni` database in the same JVM, opened with keyedstate's own options (the shared block
 * cache included) and loaded with the very bytes the store writes.
 *
 * The raw side is handed its bytes encoded up front, so it times the RocksDB call alone: `get`
 * (rocksdbjni's plain one), `put`, `merge`, `delete` with keyedstate's write options, one call
 * per operation, and for a prefix scan an iterator sought to the encoded prefix, read while keys
 * start with it. The store's side includes everything it does around that call: key and value
 * encoding, TTL stamps, the key count's memo (and the RocksDB lookup behind a write it cannot
 * answer for), the changelog record, decoding rows for the caller; its writes wait in a write
 * batch until the next read (docs/architecture.md), so writes without reads between them are
 * applied a batch at a time.
 *
 * Data, in three column families as `transformWithState` lays them out: `value` (single values:
 * ValueState), `list` (multiple values per key, appended by `merge`: ListState) and `map` (a
 * prefix-scan key encoder, first key column the prefix: MapState). Both databases are flushed and
 * fully compacted after the load, so both read the same file layout.
 *
 * Each round is one batch (a store version, committed untimed at its end); within it, every
 * operation runs over its sample through the store and directly, in alternating order between
 * rounds. Warm-up rounds run until the store's total changes by less than 5% (3 to 8 rounds);
 * the median of the measured rounds is reported.
 *
 *   ./dev/sbt "Test/runMain io.keyedstate.bench.OperationOverheadBench [keys] [sample] [rounds] [scanEntries] [trackNumKeys]" < /dev/null
 */
object OperationOverheadBench {
  private val keySchema = StructType(Seq(StructField("k", StringType), StructField("n", IntegerType)))
  private val valueSchema = StructType(Seq(StructField("v", LongType)))
  private val prefixSchema = StructType(Seq(keySchema.head))
  private val noPrefix = NoPrefixKeyStateEncoderSpec(keySchema)
  private val prefixSpec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
  private val ValueCf = "value"
  private val ListCf = "list"
  private val MapCf = "map"
  private val ListElements = 4 // per key after the load; each round appends one more to the sampled keys

  private val keyProj = UnsafeProjection.create(keySchema)
  private val valueProj = UnsafeProjection.create(valueSchema)
  private val prefixProj = UnsafeProjection.create(prefixSchema)
  private def key(k: String, n: Int): UnsafeRow = keyProj(InternalRow(UTF8String.fromString(k), n)).copy()
  private def value(v: Long): UnsafeRow = valueProj(InternalRow(v)).copy()
  private def prefixRow(k: String): UnsafeRow = prefixProj(InternalRow(UTF8String.fromString(k))).copy()

  /** One operation: its sample through the store, and the same work directly on RocksDB. */
  private final case class Op(name: String, count: Int, ours: () => Long, raw: () => Long)

  // Results are summed into this so the JIT cannot drop a read.
  private var sink = 0L

  def main(args: Array[String]): Unit = {
    val n = args.headOption.map(_.toInt).getOrElse(1000000)
    val sample = args.lift(1).map(_.toInt).getOrElse(100000)
    val rounds = args.lift(2).map(_.toInt).getOrElse(5)
    val scanEntries = args.lift(3).map(_.toInt).getOrElse(10)
    // "false" measures the store without exact key counts (trackNumKeys=false): a blind write then
    // needs no read of the key.
    val trackNumKeys = args.lift(4).forall(_.toBoolean)
    println(s"keys=$n sample=$sample rounds=$rounds scanEntries=$scanEntries trackNumKeys=$trackNumKeys " +
      s"loadavg=${loadAvg()}")
    val root = Files.createTempDirectory("keyedstate-opbench").toFile
    try run(root, n, sample, rounds, scanEntries, trackNumKeys)
    finally LocalFiles.deleteRecursively(root)
    println(s"loadavg=${loadAvg()} (sink $sink)")
  }

  private def run(root: File, n: Int, sample: Int, rounds: Int, scanEntries: Int, trackNumKeys: Boolean): Unit = {
    val sql = new SQLConf()
    sql.setConfString("spark.sql.streaming.stateStore.commitValidation.enabled", "false")
    sql.setConfString(KeyedStateConf.Prefix + "trackNumKeys", trackNumKeys.toString)
    sql.setConfString(KeyedStateConf.Prefix + "localDir", new File(root, "local").getAbsolutePath)
    val storeConf = new StateStoreConf(sql)
    val conf = KeyedStateConf(storeConf)
    println(s"settings: blockCacheSizeMB=${conf.blockCacheSizeMB} writeBufferSizeMB=${conf.writeBufferSizeMB} " +
      s"compression=${conf.compression} trackNumKeys=${conf.trackNumKeys} changelogCheckpointing=${conf.changelogCheckpointing}")

    val provider = new KeyedStateStoreProvider
    provider.init(StateStoreId(new File(root, "ckpt").getAbsolutePath, 0, 0), keySchema, valueSchema,
      noPrefix, useColumnFamilies = true, storeConf, new Configuration(), useMultipleValuesPerKey = false, None)

    // The raw database: keyedstate's options, its column families.
    val cfOptions = RocksDBResources.columnFamilyOptions(conf)
    val dbOptions = RocksDBResources.dbOptions(conf)
    val names = Seq(RocksDB.DEFAULT_COLUMN_FAMILY) ++ Seq(ValueCf, ListCf, MapCf).map(_.getBytes("UTF-8"))
    val handles = new java.util.ArrayList[ColumnFamilyHandle]()
    val rawDir = new File(root, "raw")
    rawDir.mkdirs()
    val db = RocksDB.open(dbOptions, rawDir.getAbsolutePath, names.map(new ColumnFamilyDescriptor(_, cfOptions)).asJava, handles)
    val (hValue, hList, hMap) = (handles.get(1), handles.get(2), handles.get(3))
    val writeOptions = new WriteOptions().setDisableWAL(true)
    val scanOptions = new ReadOptions()

    // The codecs the store builds for these column families: the raw side's bytes come from them.
    def codec(cf: String, spec: KeyStateEncoderSpec, multi: Boolean) =
      new ColumnFamilyCodec(StateStoreId.DEFAULT_STORE_NAME, cf, keySchema, valueSchema, spec, multi, false)
    val (cValue, cList, cMap) = (codec(ValueCf, noPrefix, false), codec(ListCf, noPrefix, true), codec(MapCf, prefixSpec, false))
    val stamp = System.currentTimeMillis()
    val numLists = n / 10
    val numPrefixes = n / scanEntries

    try {
      // ---- load: the same rows through the store (batch 0) and, encoded, into the raw database ----
      val loadStart = System.nanoTime()
      val s0 = provider.getStore(0)
      s0.createColFamilyIfAbsent(ValueCf, keySchema, valueSchema, noPrefix, useMultipleValuesPerKey = false, isInternal = false)
      s0.createColFamilyIfAbsent(ListCf, keySchema, valueSchema, noPrefix, useMultipleValuesPerKey = true, isInternal = false)
      s0.createColFamilyIfAbsent(MapCf, keySchema, valueSchema, prefixSpec, useMultipleValuesPerKey = false, isInternal = false)
      var i = 0
      while (i < n) {
        val (k, v) = (key(s"user-$i", i), value(i.toLong))
        s0.put(k, v, ValueCf)
        db.put(hValue, writeOptions, cValue.encodeKey(k), cValue.encodeValue(v, stamp))
        i += 1
      }
      i = 0
      while (i < numLists) {
        val (k, vs) = (key(s"list-$i", i), Array.tabulate(ListElements)(j => value(j.toLong)))
        s0.putList(k, vs, ListCf)
        db.put(hList, writeOptions, cList.encodeKey(k), cList.encodeValues(vs, stamp))
        i += 1
      }
      i = 0
      while (i < numPrefixes * scanEntries) {
        val (k, v) = (key(s"map-${i / scanEntries}", i % scanEntries), value(i.toLong))
        s0.put(k, v, MapCf)
        db.put(hMap, writeOptions, cMap.encodeKey(k), cMap.encodeValue(v, stamp))
        i += 1
      }
      s0.commit()
      provider.compactWorkingDb()
      db.flush(new FlushOptions().setWaitForFlush(true), handles)
      handles.asScala.foreach(h => db.compactRange(h))
      println(f"loaded $n values, $numLists lists of $ListElements, $numPrefixes prefixes of $scanEntries in " +
        f"${(System.nanoTime() - loadStart) / 1e9}%.1f s (both sides, compaction included)")

      // ---- samples: rows for the store, their encoded bytes for the raw side ----
      val rnd = new scala.util.Random(13)
      val perm = rnd.shuffle((0 until n).toVector)
      def existing(from: Int): Array[UnsafeRow] = Array.tabulate(sample)(j => { val i = perm(from + j); key(s"user-$i", i) })
      val (readKeys, blindKeys, removeKeys) = (existing(0), existing(sample), existing(2 * sample))
      val missingKeys = Array.tabulate(sample)(i => key(s"absent-$i", i))
      val listKeys = Array.tabulate(math.min(sample, numLists))(_ => { val i = rnd.nextInt(numLists); key(s"list-$i", i) })
        .distinctBy(r => r.getInt(1))
      val blindListIds = listKeys.map(_.getInt(1)).toSet
      val readListKeys = rnd.shuffle((0 until numLists).filterNot(blindListIds)).take(listKeys.length)
        .map(i => key(s"list-$i", i)).toArray
      val scanCount = math.min(sample / scanEntries * 2, numPrefixes)
      val prefixes = Array.tabulate(scanCount)(_ => s"map-${rnd.nextInt(numPrefixes)}")
      val prefixRows = prefixes.map(prefixRow)
      val values = Array.tabulate(sample)(i => value(i.toLong + 7))
      def enc(c: ColumnFamilyCodec, rows: Array[UnsafeRow]) = rows.map(c.encodeKey)
      val (readBytes, blindBytes, removeBytes, missingBytes) =
        (enc(cValue, readKeys), enc(cValue, blindKeys), enc(cValue, removeKeys), enc(cValue, missingKeys))
      val valueBytes = values.map(cValue.encodeValue(_, stamp))
      val listBytes = enc(cList, listKeys)
      val readListBytes = enc(cList, readListKeys)
      val elementBytes = values.map(v => cList.encodeValues(Array(v), stamp))
      val prefixBytes = prefixRows.map(cMap.encodePrefix)
      val mapKeys = prefixes.zipWithIndex.map { case (p, j) => key(p, j % scanEntries) }
      val mapKeyBytes = enc(cMap, mapKeys)
      val mapValueBytes = values.take(mapKeys.length).map(cMap.encodeValue(_, stamp))

      // The store of the round being run.
      var store: StateStore = null
      def loop(count: Int)(body: Int => Unit): Long = {
        val start = System.nanoTime()
        var j = 0
        while (j < count) { body(j); j += 1 }
        System.nanoTime() - start
      }
      def startsWith(k: Array[Byte], p: Array[Byte]): Boolean =
        k.length >= p.length && java.util.Arrays.equals(k, 0, p.length, p, 0, p.length)

      val ops = Seq(
        Op("get, missing key", sample,
          () => loop(sample) { j => if (store.get(missingKeys(j), ValueCf) != null) sys.error("hit") },
          () => loop(sample) { j => if (db.get(hValue, missingBytes(j)) != null) sys.error("hit") }),
        Op("get, existing key", sample,
          () => loop(sample) { j => sink += store.get(readKeys(j), ValueCf).getLong(0) },
          () => loop(sample) { j => sink += db.get(hValue, readBytes(j)).length }),
        Op("put, update of a key read before", sample,
          () => loop(sample) { j => store.put(readKeys(j), values(j), ValueCf) },
          () => loop(sample) { j => db.put(hValue, writeOptions, readBytes(j), valueBytes(j)) }),
        Op("put, blind update", sample,
          () => loop(sample) { j => store.put(blindKeys(j), values(j), ValueCf) },
          () => loop(sample) { j => db.put(hValue, writeOptions, blindBytes(j), valueBytes(j)) }),
        // Put back untimed after the remove (the memo then answers the store's puts).
        Op("remove, blind", sample,
          () => {
            val t = loop(sample) { j => store.remove(removeKeys(j), ValueCf) }
            loop(sample) { j => store.put(removeKeys(j), values(j), ValueCf) }
            t
          },
          () => {
            val t = loop(sample) { j => db.delete(hValue, writeOptions, removeBytes(j)) }
            loop(sample) { j => db.put(hValue, writeOptions, removeBytes(j), valueBytes(j)) }
            t
          }),
        Op("merge, blind append to a list", listKeys.length,
          () => loop(listKeys.length) { j => store.merge(listKeys(j), values(j), ListCf) },
          () => loop(listKeys.length) { j => db.merge(hList, writeOptions, listBytes(j), elementBytes(j)) }),
        Op("valuesIterator, whole list", listKeys.length,
          () => loop(listKeys.length) { j =>
            val it = store.valuesIterator(listKeys(j), ListCf)
            while (it.hasNext) sink += it.next().getLong(0)
          },
          () => loop(listKeys.length) { j => sink += db.get(hList, listBytes(j)).length }),
        // The keyed-function engine's pattern: its lookup reads the key's list (untimed here), then
        // the function appends (ListState.add). Lists of their own, so the others grow as before.
        Op("merge, append to a list read before", readListKeys.length,
          () => {
            loop(readListKeys.length) { j => store.valuesIterator(readListKeys(j), ListCf).foreach(v => sink += v.getLong(0)) }
            loop(readListKeys.length) { j => store.merge(readListKeys(j), values(j), ListCf) }
          },
          () => {
            loop(readListKeys.length) { j => sink += db.get(hList, readListBytes(j)).length }
            loop(readListKeys.length) { j => db.merge(hList, writeOptions, readListBytes(j), elementBytes(j)) }
          }),
        Op(s"prefixScan, $scanEntries entries", prefixRows.length,
          () => loop(prefixRows.length) { j =>
            val it = store.prefixScan(prefixRows(j), MapCf)
            try while (it.hasNext) { val p = it.next(); sink += p.key.getInt(1) + p.value.getLong(0) }
            finally it.close()
          },
          () => loop(prefixRows.length) { j =>
            val p = prefixBytes(j)
            val it = db.newIterator(hMap, scanOptions)
            try {
              it.seek(p)
              while (it.isValid && startsWith(it.key(), p)) { sink += it.key().length + it.value().length; it.next() }
            } finally it.close()
          }),
        // The engine's map pattern: its lookup scans the key's map, then the function puts an
        // entry (MapState.put): the scan vouches for which entries exist.
        Op("put, map entry under a scanned prefix", prefixRows.length,
          () => loop(prefixRows.length) { j => store.put(mapKeys(j), values(j), MapCf) },
          () => loop(prefixRows.length) { j => db.put(hMap, writeOptions, mapKeyBytes(j), mapValueBytes(j)) }))

      // ---- rounds: one batch each ----
      var version = 1L
      def round(index: Int): Seq[(Long, Long)] = {
        store = provider.getStore(version)
        val times = ops.map { op =>
          if (index % 2 == 0) { val o = op.ours(); val r = op.raw(); (o / op.count, r / op.count) }
          else { val r = op.raw(); val o = op.ours(); (o / op.count, r / op.count) }
        }
        store.commit()
        version += 1
        times
      }
      var warm = 0
      var previous = Long.MaxValue
      var settled = false
      while (warm < 8 && !(warm >= 3 && settled)) {
        val total = round(warm).map(_._1).sum
        settled = math.abs(total - previous).toDouble / previous < 0.05
        println(s"warm-up round ${warm + 1}: store total ${total} ns over the ops (loadavg ${loadAvg()})")
        previous = total
        warm += 1
      }
      val measured = (0 until rounds).map { r =>
        val t = round(warm + r)
        println(s"round ${r + 1}: loadavg ${loadAvg()}")
        t
      }

      def median(xs: Seq[Long]): Long = { val s = xs.sorted; s(s.length / 2) }
      println()
      println(f"${"ns per operation (median of " + rounds + " rounds)"}%-40s ${"keyedstate"}%11s ${"raw"}%9s ${"ratio"}%7s")
      ops.zipWithIndex.foreach { case (op, k) =>
        val o = median(measured.map(_(k)._1))
        val r = median(measured.map(_(k)._2))
        println(f"${op.name}%-40s $o%11d $r%9d ${o.toDouble / r}%7.2f")
      }
    } finally {
      provider.close()
      scanOptions.close(); writeOptions.close()
      handles.asScala.foreach(_.close())
      db.close(); dbOptions.close(); cfOptions.close()
    }
  }

  private def loadAvg(): String =
    scala.util.Try(scala.io.Source.fromFile("/proc/loadavg").mkString.split(' ').take(3).mkString(" "))
      .getOrElse("n/a")
}
