package io.keyedstate.bench

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import org.rocksdb._

import io.keyedstate.checkpoint.LocalFiles
import io.keyedstate.rocks.PointReads

/**
 * rocksdbjni's `get` (a C++ exception per missing key inside JNI) against [[PointReads.get]]
 * (`keyMayExist` first), on one RocksDB configured as the provider's column families: missing and
 * found keys, in memtables and in SST files, small and large values.
 */
object PointReadBench {
  def run(n: Int, rounds: Int): Seq[(String, Long, Long)] = {
    RocksDB.loadLibrary()
    val dir = Files.createTempDirectory("keyedstate-bench-rocks").toFile
    val cache = new LRUCache(64L * 1024 * 1024)
    val cfOptions = new ColumnFamilyOptions()
      .setTableFormatConfig(new BlockBasedTableConfig().setBlockCache(cache)
        .setFilterPolicy(new BloomFilter(10, false)).setBlockSize(16 * 1024).setFormatVersion(5))
      .setCompressionType(CompressionType.LZ4_COMPRESSION)
      .setMergeOperator(new StringAppendOperator(""))
      .setWriteBufferSize(512L * 1024 * 1024) // everything stays in the memtable until the flush
    val dbOptions = new DBOptions().setCreateIfMissing(true).setCreateMissingColumnFamilies(true)
    val handles = new java.util.ArrayList[ColumnFamilyHandle]()
    val db = RocksDB.open(dbOptions, dir.getAbsolutePath,
      Seq(new ColumnFamilyDescriptor(RocksDB.DEFAULT_COLUMN_FAMILY, cfOptions)).asJava, handles)
    val cf = handles.get(0)
    val writeOptions = new WriteOptions().setDisableWAL(true)
    try {
      val present = Array.tabulate(n)(i => s"user-$i-present".getBytes(UTF_8))
      val missing = Array.tabulate(n)(i => s"user-$i-missing".getBytes(UTF_8))
      val value = Array.fill[Byte](40)(7)
      present.foreach(db.put(cf, writeOptions, _, value))
      val mid = Array.tabulate(n / 10)(i => s"mid-$i".getBytes(UTF_8))
      val midValue = Array.tabulate[Byte](4 * 1024)(_.toByte)
      mid.foreach(db.put(cf, writeOptions, _, midValue))
      val big = Array.tabulate(20)(i => s"big-$i".getBytes(UTF_8))
      val bigValue = Array.tabulate[Byte](2 * 1024 * 1024)(_.toByte) // larger than the read buffer
      big.foreach(db.put(cf, writeOptions, _, bigValue))

      def compare(name: String, keys: Array[Array[Byte]], expect: Array[Byte]): (String, Long, Long) = {
        def pass(read: Array[Byte] => Array[Byte]): Long = {
          val start = System.nanoTime()
          keys.foreach { k =>
            val v = read(k)
            if (!java.util.Arrays.equals(v, expect)) sys.error(s"$name: wrong value")
          }
          (System.nanoTime() - start) / keys.length
        }
        val times = (1 to rounds).map(_ => (pass(db.get(cf, _)), pass(PointReads.get(db, cf, _))))
        (name, times.map(_._1).min, times.map(_._2).min)
      }
      val inMemtable = Seq(
        compare("memtable: missing key", missing, null),
        compare("memtable: found, 40 B", present, value),
        compare("memtable: found, 4 KiB", mid, midValue),
        compare("memtable: found, 2 MiB", big, bigValue))
      db.flush(new FlushOptions().setWaitForFlush(true), cf)
      inMemtable ++ Seq(
        compare("SST: missing key", missing, null),
        compare("SST: found, 40 B", present, value),
        compare("SST: found, 4 KiB", mid, midValue),
        compare("SST: found, 2 MiB", big, bigValue))
    } finally {
      writeOptions.close(); cf.close(); db.close(); dbOptions.close(); cfOptions.close(); cache.close()
      LocalFiles.deleteRecursively(dir)
    }
  }
}
