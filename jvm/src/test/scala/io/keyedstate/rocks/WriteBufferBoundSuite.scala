package io.keyedstate.rocks

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.ProviderFixture

/**
 * `heapWriteBufferMB` bounds the write buffers of every store in the JVM together: many stores,
 * each far below any size of its own, do not hold more than the bound (plus one write and the
 * counter's step), and the executor-wide total is never below what they hold.
 */
class WriteBufferBoundSuite extends AnyFunSuite with ProviderFixture {
  test("many small stores together stay within the bound; every write reads back") {
    val conf = KeyedStateConf.fromMap(Map("spark.sql.streaming.stateStore.keyedstate.heapWriteBufferMB" -> "1"))
    val bound = 1024L * 1024
    val dbs = (0 until 12).map(i => LocalRocksDB.open(new File(tempDir(), s"db-$i"), conf))
    try {
      val value = Array.fill[Byte](1000)(7)
      for (n <- 0 until 100; (db, i) <- dbs.zipWithIndex) {
        db.put(LocalRocksDB.DefaultColumnFamily, s"key-$i-$n".getBytes(UTF_8), value)
        val held = dbs.map(_.heapBufferedBytes).sum
        assert(held <= bound + 64 * 1024, s"the stores' buffers hold $held bytes, over the bound of $bound")
        val total = LocalRocksDB.bufferedBytesInJvm
        assert(total >= held, "the executor-wide total is below what the buffers hold")
        assert(total <= bound + 64 * 1024 + dbs.size * 32 * 1024, s"the executor-wide total is $total bytes")
      }
      for ((db, i) <- dbs.zipWithIndex; n <- 0 until 100) {
        assert(java.util.Arrays.equals(db.get(LocalRocksDB.DefaultColumnFamily, s"key-$i-$n".getBytes(UTF_8)), value))
      }
    } finally dbs.foreach(_.close())
  }
}
