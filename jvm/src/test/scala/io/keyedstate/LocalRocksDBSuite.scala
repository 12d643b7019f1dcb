package io.keyedstate

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.Files

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.LocalFiles
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB

/** Point reads (keyMayExist first, `get` as the fallback) return exactly what `get` would. */
class LocalRocksDBSuite extends AnyFunSuite {
  private def b(s: String): Array[Byte] = s.getBytes(UTF_8)

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
}
