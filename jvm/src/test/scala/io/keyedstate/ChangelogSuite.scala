package io.keyedstate

import java.io.{File, RandomAccessFile}
import java.nio.charset.StandardCharsets.UTF_8

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, NoPrefixKeyStateEncoderSpec, PrefixKeyScanStateEncoderSpec, RangeKeyScanStateEncoderSpec}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.commit.Changelog
import io.keyedstate.checkpoint.commit.Changelog.Codec
import io.keyedstate.conf.{CheckpointFileException, KeyedStateConf}
import io.keyedstate.rocks.{ColumnFamilyCodec, KeyGroups, LocalRocksDB}

/** The changelog file format: every codec replays exactly, and damage is reported, never applied quietly. */
class ChangelogSuite extends AnyFunSuite with ProviderFixture {
  private val conf = KeyedStateConf.fromMap(Map.empty)
  private def b(s: String): Array[Byte] = s.getBytes(UTF_8)
  private val big = Array.tabulate[Byte](200 * 1024)(i => (i * 31 % 251).toByte) // larger than a block

  /** Writes the same operations to a changelog and to a reference database. */
  private def write(codec: Codec, file: File, reference: LocalRocksDB): Long = {
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

  for (codec <- Codec.all) {
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

  for (codec <- Codec.all.filter(_ != Codec.NoCompression)) {
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
    try write(Codec.Lz4, file, reference) finally reference.close()
    val raf = new RandomAccessFile(file, "rw")
    try { raf.seek(5); raf.write(9) } finally raf.close()
    replayFails(file, "unknown compression codec id 9")
    val raf2 = new RandomAccessFile(file, "rw")
    try { raf2.seek(4); raf2.write(1) } finally raf2.close()
    replayFails(file, "format version 1")
  }

  // ---------------------------------------------------------------------------------------------
  // Keys without their key-group tag

  private val userKeySchema = StructType(Seq(
    StructField("id", LongType),
    StructField("name", StringType),
    StructField("window", StructType(Seq(StructField("start", LongType), StructField("end", LongType)))),
    StructField("ts", LongType, nullable = false)))
  private val timerSchema = StructType(Seq(StructField("ts", LongType, nullable = false), StructField("id", LongType)))
  private val longValue = StructType(Seq(StructField("v", LongType)))

  private def keyRow(i: Int): UnsafeRow = {
    val name = if (i % 7 == 0) null else UTF8String.fromString(s"user-$i-${"x" * (i % 13)}")
    val window = if (i % 11 == 0) null else InternalRow(i.toLong * 1000, i.toLong * 1000 + 500)
    UnsafeProjection.create(userKeySchema)(InternalRow(i.toLong * 7919, name, window, i.toLong)).copy()
  }

  /** One column family per key encoding; the last one's tag hashes ordering columns (kept whole). */
  private val families: Seq[(ColumnFamilyCodec, Int => UnsafeRow)] = {
    def codec(name: String, schema: StructType, spec: KeyStateEncoderSpec) =
      new ColumnFamilyCodec("default", name, schema, longValue, spec, multipleValues = false, isInternal = false)
    Seq(
      codec("plain", userKeySchema, NoPrefixKeyStateEncoderSpec(userKeySchema)) -> keyRow _,
      codec("prefixed", userKeySchema, PrefixKeyScanStateEncoderSpec(userKeySchema, 2)) -> keyRow _,
      codec("ranged", userKeySchema, RangeKeyScanStateEncoderSpec(userKeySchema, Seq(3))) -> keyRow _,
      codec("timers", timerSchema, RangeKeyScanStateEncoderSpec(timerSchema, Seq(0, 1))) -> ((i: Int) =>
        UnsafeProjection.create(timerSchema)(InternalRow(i.toLong * 31, i.toLong)).copy()))
  }
  private def valueOf(i: Int): Array[Byte] = b(s"value-$i")

  /** Writes the stored (tagged) keys of every family to a changelog and to a reference database. */
  private def writeStoredKeys(file: File, reference: LocalRocksDB, withRules: Boolean,
      tagOf: Array[Byte] => Array[Byte] = identity): Int = {
    val rules = families.map { case (c, _) => c.name -> c.keyGroupRule }.toMap
    val w = new Changelog.Writer(file, Codec.NoCompression, if (withRules) rules else _ => None)
    var written = 0
    for ((codec, row) <- families) {
      w.createColumnFamily(codec.name); reference.createColumnFamily(codec.name)
      (0 until 300).foreach { i =>
        val k = codec.encodeKey(row(i))
        w.put(codec.name, tagOf(k), valueOf(i)); reference.put(codec.name, k, valueOf(i))
        if (i % 4 == 0) { w.delete(codec.name, tagOf(k)); reference.delete(codec.name, k) }
        written += 1
      }
    }
    w.finish()
    written
  }

  test("stored keys are written without their key-group tag where it can be recomputed, and replay restores them exactly") {
    assert(families.map(_._1.keyGroupRule.isDefined) === Seq(true, true, true, false))
    val dir = tempDir()
    val reference = LocalRocksDB.open(new File(dir, "reference"), conf)
    val replayed = LocalRocksDB.open(new File(dir, "replayed"), conf)
    try {
      val untagged = new File(dir, "untagged.changelog")
      val whole = new File(dir, "whole.changelog")
      writeStoredKeys(untagged, reference, withRules = true)
      writeStoredKeys(whole, LocalRocksDB.open(new File(dir, "unused"), conf), withRules = false)
      Changelog.replay(untagged, replayed, "test", 1)
      assert(dump(replayed) === dump(reference))
      // Every key of the three families with a rule, put or deleted, is 4 bytes shorter; the rules cost once each.
      val ruledRecords = 3 * (300 + 75)
      val saved = whole.length() - untagged.length()
      assert(saved > KeyGroups.TagBytes * ruledRecords - 3 * 1024 && saved < KeyGroups.TagBytes * ruledRecords,
        s"$saved bytes saved for $ruledRecords records")
    } finally { replayed.close(); reference.close() }
  }

  test("a column family dropped and created again with another key schema is defined again in the same file") {
    val dir = tempDir()
    val reference = LocalRocksDB.open(new File(dir, "reference"), conf)
    val replayed = LocalRocksDB.open(new File(dir, "replayed"), conf)
    try {
      val (first, firstRow) = families.head
      val (second, secondRow) = families(2) // another key encoding and partitioning columns
      var current = first
      val file = new File(dir, "1.changelog")
      val w = new Changelog.Writer(file, Codec.Zstd, _ => current.keyGroupRule)
      def putBoth(i: Int, row: Int => UnsafeRow): Unit = {
        val k = current.encodeKey(row(i))
        w.put("cf", k, valueOf(i)); reference.put("cf", k, valueOf(i))
      }
      w.createColumnFamily("cf"); reference.createColumnFamily("cf")
      (0 until 50).foreach(putBoth(_, firstRow))
      w.dropColumnFamily("cf"); reference.dropColumnFamily("cf")
      current = second
      w.createColumnFamily("cf"); reference.createColumnFamily("cf")
      (0 until 50).foreach(putBoth(_, secondRow))
      w.finish()
      Changelog.replay(file, replayed, "test", 1)
      assert(dump(replayed) === dump(reference) && dump(replayed)("cf").size == 50)
    } finally { replayed.close(); reference.close() }
  }

  test("a replay that recomputes other key-group tags than were written fails naming the file and the version") {
    val dir = tempDir()
    val reference = LocalRocksDB.open(new File(dir, "reference"), conf)
    val file = new File(dir, "1.changelog")
    // Keys written with tags their rule does not give (as if the key encoding had changed).
    val wrongTag = (k: Array[Byte]) => KeyGroups.withTag(KeyGroups.withoutTag(k), KeyGroups.tagOf(k) + 1)
    try writeStoredKeys(file, reference, withRules = true, wrongTag) finally reference.close()
    replayFails(file, "key-group tags recomputed on replay")
  }
}
