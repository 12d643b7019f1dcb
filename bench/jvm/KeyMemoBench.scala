package io.keyedstate.bench

import java.nio.ByteBuffer

import scala.collection.mutable

import io.keyedstate.KeyMemo

/**
 * The key count's memo before (a `HashMap[ByteBuffer, java.lang.Boolean]` per column family, a
 * sorted set of scanned prefix lengths: [[OldMemo]], as in commit ed119c3) and now
 * ([[KeyMemo]]), driven by the provider's sequences per key: read then write a new key; read then
 * rewrite a known one; scan an empty prefix then write two entries under it.
 */
object KeyMemoBench {
  def run(n: Int, rounds: Int): Seq[(String, Long, Long)] = {
    val cf = "default"
    // Fresh arrays per use, as the encoders hand them out: 28-byte keys as UnsafeRow (string, int).
    def keys(tag: Int) = Array.tabulate(n)(i => f"$tag%02d-user-$i%012d-abcdefgh".getBytes("UTF-8").take(28))
    val (reads, writes, rewrites) = (keys(0), keys(0).map(_.clone()), keys(0).map(_.clone()))
    val prefixes = Array.tabulate(n)(i => f"p-$i%010d".getBytes("UTF-8"))
    val entries = Array.tabulate(2 * n)(i => prefixes(i / 2) ++ f"-e$i%d".getBytes("UTF-8"))

    def newKeys(old: Boolean): Long = timed {
      if (old) { val m = new OldMemo; var i = 0; while (i < n) { m.remember(cf, reads(i), false); m.exists(cf, writes(i)); m.remember(cf, writes(i), true); i += 1 } }
      else { val m = new KeyMemo(1000000); var i = 0; while (i < n) { m.learn(cf, reads(i), false, m.epoch); m.existedBefore(cf, writes(i), existsNow = true); i += 1 } }
    }
    def knownKeys(old: Boolean): Long = timed {
      if (old) { val m = new OldMemo; var i = 0; while (i < n) { m.remember(cf, reads(i), true); m.exists(cf, rewrites(i)); m.remember(cf, rewrites(i), true); i += 1 } }
      else { val m = new KeyMemo(1000000); var i = 0; while (i < n) { m.learn(cf, reads(i), true, m.epoch); m.existedBefore(cf, rewrites(i), existsNow = true); i += 1 } }
    }
    def scanned(old: Boolean): Long = timed {
      if (old) {
        val m = new OldMemo; var i = 0
        while (i < n) {
          m.rememberScanned(cf, prefixes(i), Nil)
          var j = 2 * i; while (j < 2 * i + 2) { m.exists(cf, entries(j)); m.remember(cf, entries(j), true); j += 1 }
          i += 1
        }
      } else {
        val m = new KeyMemo(1000000); var i = 0
        while (i < n) {
          m.learnScanned(cf, prefixes(i), Nil, m.epoch)
          var j = 2 * i; while (j < 2 * i + 2) { m.existedBefore(cf, entries(j), existsNow = true); j += 1 }
          i += 1
        }
      }
    }
    Seq(("memo: read + write, new key", newKeys _), ("memo: read + write, known key", knownKeys _),
        ("memo: scan + 2 new entries", scanned _)).map { case (name, f) =>
      val times = (1 to rounds).map(_ => (f(true) / n, f(false) / n))
      (name, times.map(_._1).min, times.map(_._2).min)
    }
  }

  private def timed(f: => Unit): Long = { val start = System.nanoTime(); f; System.nanoTime() - start }

  /** The memo as it was (StoreInstance before KeyMemo), for comparison; the RocksDB fallback left out. */
  private final class OldMemo {
    private val knownKeys = mutable.Map[String, java.util.HashMap[ByteBuffer, java.lang.Boolean]]()
    private var knownKeyCount = 0
    private final class ScannedPrefixes {
      val prefixes = new java.util.HashSet[ByteBuffer]()
      val lengths = mutable.SortedSet[Int]()
    }
    private val scannedPrefixes = mutable.Map[String, ScannedPrefixes]()

    def remember(cf: String, key: Array[Byte], exists: Boolean): Unit = if (knownKeyCount < 1000000) {
      val stable = ByteBuffer.wrap(key.clone())
      if (knownKeys.getOrElseUpdate(cf, new java.util.HashMap()).put(stable, exists) == null) knownKeyCount += 1
    }
    def rememberScanned(cf: String, prefix: Array[Byte], keys: Iterable[Array[Byte]]): Unit =
      if (knownKeyCount + keys.size < 1000000) {
        keys.foreach(remember(cf, _, exists = true))
        val scanned = scannedPrefixes.getOrElseUpdate(cf, new ScannedPrefixes)
        if (scanned.prefixes.add(ByteBuffer.wrap(prefix.clone()))) knownKeyCount += 1
        scanned.lengths += prefix.length
      }
    private def underScannedPrefix(cf: String, key: Array[Byte]): Boolean =
      scannedPrefixes.get(cf).exists { scanned =>
        scanned.lengths.exists(n => n < key.length && scanned.prefixes.contains(ByteBuffer.wrap(key, 0, n)))
      }
    def exists(cf: String, key: Array[Byte]): Boolean =
      knownKeys.get(cf).flatMap(m => Option(m.get(ByteBuffer.wrap(key)))) match {
        case Some(known) => known.booleanValue()
        case None => !underScannedPrefix(cf, key) && sys.error("the benchmark never needs RocksDB")
      }
  }
}
