package io.keyedstate.checkpoint.commit

import java.io.{File, RandomAccessFile}
import java.nio.charset.StandardCharsets.UTF_8

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.commit.Changelog
import io.keyedstate.checkpoint.commit.Changelog.Compression
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.errors.CheckpointFileException
import io.keyedstate.ProviderFixture

/** The changelog file format: every codec replays exactly, and damage is reported, never applied quietly. */
class ChangelogSuite extends AnyFunSuite with ProviderFixture {
  private val conf = KeyedStateConf.fromMap(Map.empty)
  private def b(s: String): Array[Byte] = s.getBytes(UTF_8)
  private val big = Array.tabulate[Byte](200 * 1024)(i => (i * 31 % 251).toByte) // larger than a block

  /** Writes the same operations to a changelog and to a reference database. */
  private def write(codec: Compression, file: File, reference: LocalRocksDB): Long = {
    val w = new Changelog.Writer(file, codec)
    def both(log: Changelog.Writer => Unit, db: LocalRocksDB => Unit): Unit = { log(w); db(reference) }
    both(_.createColumnFamily("cf"), _.createColumnFamily("cf"))
    (0 until 2000).foreach { i =>
      val k = b(f"key-$i%05d"); val v = b(s"value-${i * 7}")
      both(_.put("default", k, v), _.put("default", k, v))
      if (i % 3 == 0) both(_.merge("cf", k, v), _.merge("cf", k, v))
      if (i % 5 == 0) both(_.delete("default", k), _.delete("default", k))
    }
    both(_.put("default", b("empty"), Array.emptyByteArray), _.put("default", b("empty"), Array.emptyByteArray))
    both(_.put("cf", b("big"), big), _.put("cf", b("big"), big))
    both(_.deleteRange("default", b("key-00100"), b("key-00200")),
      _.deleteRange("default", b("key-00100"), b("key-00200")))
    both(_.createColumnFamily("gone"), _.createColumnFamily("gone"))
    both(_.put("gone", b("x"), b("y")), _.put("gone", b("x"), b("y")))
    both(_.dropColumnFamily("gone"), _.dropColumnFamily("gone"))
    w.finish()
    w.numRecords
  }

  private def dump(db: LocalRocksDB): Map[String, Seq[(String, String)]] =
    db.columnFamilies.toSeq.map { cf =>
      val it = db.scan(cf, None, None)
      try cf -> it.map { case (k, v) => (new String(k, UTF_8), java.util.Arrays.hashCode(v).toString) }.toSeq
      finally it.close()
    }.toMap

  private def replayFails(file: File, mustMention: String*): CheckpointFileException = {
    val db = LocalRocksDB.open(new File(tempDir(), "db"), conf)
    try {
      val e = intercept[CheckpointFileException](Changelog.replay(file, db, s"changelog/${file.getName}", 7))
      (Seq(s"changelog/${file.getName}", "version 7", "damaged") ++ mustMention)
        .foreach(m => assert(e.getMessage.contains(m), s"'${e.getMessage}' should mention '$m'"))
      e
    } finally db.close()
  }

  for (codec <- Compression.all) {
    test(s"a changelog compressed with ${codec.name} records its codec and replays every operation exactly") {
      val dir = tempDir()
      val reference = LocalRocksDB.open(new File(dir, "reference"), conf)
      val file = new File(dir, "1.changelog")
      val records = write(codec, file, reference)
      val header = java.nio.file.Files.readAllBytes(file.toPath).take(6)
      assert(header(4) == Changelog.FormatVersion && header(5) == codec.id)
      val replayed = LocalRocksDB.open(new File(dir, "replayed"), conf)
      try {
        assert(Changelog.replay(file, replayed, "test", 1) == records)
        assert(dump(replayed) == dump(reference))
        assert(dump(replayed)("cf").exists(_._1 == "big"))
      } finally { replayed.close(); reference.close() }
    }
  }

  for (codec <- Compression.all.filter(_ != Compression.NoCompression)) {
    test(s"a damaged ${codec.name} changelog fails its replay naming the file and the version, wherever the damage is") {
      val dir = tempDir()
      val reference = LocalRocksDB.open(new File(dir, "reference"), conf)
      val file = new File(dir, "1.changelog")
      try write(codec, file, reference) finally reference.close()
      val original = java.nio.file.Files.readAllBytes(file.toPath)
      // Every 97th byte of the compressed body, and its last bytes (the codec's trailer).
      val positions = ((6 until original.length by 97) ++ (original.length - 4 until original.length)).distinct
      positions.foreach { pos =>
        val damaged = original.clone()
        damaged(pos) = (damaged(pos) ^ 0x5a).toByte
        java.nio.file.Files.write(file.toPath, damaged)
        withClue(s"byte $pos of ${original.length}: ")(replayFails(file))
      }
      java.nio.file.Files.write(file.toPath, original.take(original.length - 3))
      replayFails(file)
    }
  }

  test("an unknown codec or an older format is refused by name, not guessed") {
    val dir = tempDir()
    val reference = LocalRocksDB.open(new File(dir, "reference"), conf)
    val file = new File(dir, "1.changelog")
    try write(Compression.Lz4, file, reference) finally reference.close()
    val raf = new RandomAccessFile(file, "rw")
    try { raf.seek(5); raf.write(9) } finally raf.close()
    replayFails(file, "unknown compression codec id 9")
    val raf2 = new RandomAccessFile(file, "rw")
    try { raf2.seek(4); raf2.write(1) } finally raf2.close()
    replayFails(file, "format version 1")
  }

  test("a column family dropped and created again in one file replays exactly") {
    val dir = tempDir()
    val reference = LocalRocksDB.open(new File(dir, "reference"), conf)
    val replayed = LocalRocksDB.open(new File(dir, "replayed"), conf)
    try {
      val file = new File(dir, "1.changelog")
      val w = new Changelog.Writer(file, Compression.Zstd)
      def both(log: Changelog.Writer => Unit, db: LocalRocksDB => Unit): Unit = { log(w); db(reference) }
      both(_.createColumnFamily("cf"), _.createColumnFamily("cf"))
      (0 until 50).foreach(i => both(_.put("cf", b(s"first-$i"), b("1")), _.put("cf", b(s"first-$i"), b("1"))))
      both(_.dropColumnFamily("cf"), _.dropColumnFamily("cf"))
      both(_.createColumnFamily("cf"), _.createColumnFamily("cf"))
      (0 until 50).foreach(i => both(_.put("cf", b(s"second-$i"), b("2")), _.put("cf", b(s"second-$i"), b("2"))))
      w.finish()
      Changelog.replay(file, replayed, "test", 1)
      assert(dump(replayed) === dump(reference) && dump(replayed)("cf").size == 50)
    } finally { replayed.close(); reference.close() }
  }
}
