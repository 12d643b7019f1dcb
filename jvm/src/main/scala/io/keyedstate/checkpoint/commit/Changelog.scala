package io.keyedstate.checkpoint.commit

import java.io._
import java.nio.charset.StandardCharsets.UTF_8

import scala.collection.mutable
import scala.util.control.NonFatal

import com.github.luben.zstd.{RecyclingBufferPool, ZstdInputStreamNoFinalizer, ZstdOutputStreamNoFinalizer}
import net.jpountz.lz4.{LZ4BlockInputStream, LZ4BlockOutputStream}

import io.keyedstate.checkpoint.LocalFileOutput
import io.keyedstate.conf.{CheckpointFileException, KeyedStateErrors}
import io.keyedstate.rocks.{KeyGroupRule, KeyGroups, LocalRocksDB}

/**
 * The changes of one version, as a replayable log: what a commit uploads between snapshots.
 *
 * Format 3: an uncompressed header (magic, format version, codec id), so a reader never guesses
 * the codec; then, compressed with that codec, records `[op][cf id][fields]`, an end marker and
 * the checksum of the key-group tags left out, so a truncated file is detected on replay. Ids
 * and lengths are unsigned varints (a key or a value length is one byte for rows under 128
 * bytes). A column family is named once per file (`DefineCf`) and referred to by its small id
 * afterwards.
 *
 * Key-group tags: when the family's [[KeyGroupRule]] can recompute a stored key's tag from the
 * key alone, `DefineCf` records the rule and the family's keys are written without their 4-byte
 * tag (random bytes no codec compresses: about 40% of a compressed record). Replay recomputes
 * each tag and checks the recomputed tags against the checksum of the written ones, so a rule
 * that decodes a key differently fails the load instead of storing keys under wrong tags.
 * The codecs' own checks (LZ4's block checksums, ZSTD's frame checksum) come on top of the
 * CRC32C the manifest keeps of the file.
 */
object Changelog {
  private val Magic = 0x4b534c47 // "KSLG"
  val FormatVersion = 3

  private val DefineCf: Byte = 0
  private val Put: Byte = 1
  private val Delete: Byte = 2
  private val Merge: Byte = 3
  private val DeleteRange: Byte = 4
  private val CreateCf: Byte = 5
  private val DropCf: Byte = 6
  private val End: Byte = 127

  /** A compression codec of the record stream; `id` is what the header records. */
  sealed abstract class Codec(val id: Byte, val name: String) {
    def compress(out: OutputStream): OutputStream
    def decompress(in: InputStream): InputStream
  }
  object Codec {
    case object NoCompression extends Codec(0, "none") {
      def compress(out: OutputStream): OutputStream = out
      def decompress(in: InputStream): InputStream = in
    }
    case object Lz4 extends Codec(1, "lz4") {
      def compress(out: OutputStream): OutputStream = new LZ4BlockOutputStream(out, BlockSize)
      def decompress(in: InputStream): InputStream = LZ4BlockInputStream.newBuilder().build(in)
    }
    /** Level 3, zstd's default: the changelog is written once per version and read only on a load. */
    case object Zstd extends Codec(2, "zstd") {
      def compress(out: OutputStream): OutputStream =
        new ZstdOutputStreamNoFinalizer(out, RecyclingBufferPool.INSTANCE).setLevel(3).setChecksum(true)
      def decompress(in: InputStream): InputStream =
        new ZstdInputStreamNoFinalizer(in, RecyclingBufferPool.INSTANCE).setContinuous(false)
    }
    val all: Seq[Codec] = Seq(NoCompression, Lz4, Zstd)
    def named(name: String): Codec =
      all.find(_.name == name).getOrElse(throw KeyedStateErrors.invalidOption(s"Unknown changelog codec '$name'"))
  }

  private val BlockSize = 1 << 16

  /** Folds one key-group tag into a file's tag checksum (order-sensitive, as replay is ordered). */
  private def tagChecksum(sum: Long, tag: Int): Long = sum * 1000003L + (tag & 0xffffffffL)

  /** A column family as one changelog file knows it: its id and whether its keys lose their tag. */
  private final class FileCf(val id: Int, val untagged: Boolean)

  /**
   * Records one version's writes to a local file, compressed with `codec`. `rules` gives a
   * column family's [[KeyGroupRule]] if its keys are written without their tag. A failed write of
   * the file (a full local disk) is a `LocalDiskException` naming it, thrown by the write that met it.
   */
  final class Writer(
      val file: File,
      codec: Codec = Codec.Zstd,
      rules: String => Option[KeyGroupRule] = _ => None) extends AutoCloseable {
    private val out = {
      val raw = new BufferedOutputStream(new LocalFileOutput(file, "the state changelog"), BlockSize)
      val header = new DataOutputStream(raw)
      header.writeInt(Magic)
      header.writeByte(FormatVersion)
      header.writeByte(codec.id) // buffered with the records: a full disk fails the first block's write
      new DataOutputStream(new BufferedOutputStream(codec.compress(raw), BlockSize))
    }
    private val cfs = mutable.HashMap[String, FileCf]()
    private var nextId = 0
    private var records = 0L
    private var tags = 0L
    private var closed = false

    def numRecords: Long = records

    private def varint(v: Int): Unit = {
      var rest = v
      while ((rest & ~0x7f) != 0) { out.writeByte((rest & 0x7f) | 0x80); rest >>>= 7 }
      out.writeByte(rest)
    }
    private def cf(name: String): FileCf = cfs.getOrElse(name, {
      val rule = rules(name)
      val c = new FileCf(nextId, rule.isDefined)
      nextId += 1
      out.writeByte(DefineCf); varint(c.id); out.writeUTF(name)
      rule match {
        case Some(r) => out.writeByte(1); bytes(r.json.getBytes(UTF_8))
        case None => out.writeByte(0)
      }
      cfs(name) = c
      c
    })
    private def bytes(b: Array[Byte]): Unit = { varint(b.length); out.write(b) }
    /** A stored key: without its tag when the family's rule recomputes it. */
    private def key(c: FileCf, k: Array[Byte]): Unit =
      if (!c.untagged) bytes(k)
      else {
        val n = k.length - KeyGroups.TagBytes
        // The tag's big-endian int, read in place (per record: no buffer, no check beyond the index).
        tags = tagChecksum(tags, (k(n) & 0xff) << 24 | (k(n + 1) & 0xff) << 16 | (k(n + 2) & 0xff) << 8 | (k(n + 3) & 0xff))
        varint(n); out.write(k, 0, n)
      }
    private def record(op: Byte, name: String)(fields: FileCf => Unit): Unit = {
      val c = cf(name)
      out.writeByte(op); varint(c.id)
      fields(c)
      records += 1
    }

    def put(name: String, k: Array[Byte], value: Array[Byte]): Unit = record(Put, name) { c => key(c, k); bytes(value) }
    def merge(name: String, k: Array[Byte], value: Array[Byte]): Unit = record(Merge, name) { c => key(c, k); bytes(value) }
    def delete(name: String, k: Array[Byte]): Unit = record(Delete, name)(key(_, k))
    /** Range bounds are not stored keys: written whole. */
    def deleteRange(name: String, begin: Array[Byte], end: Array[Byte]): Unit =
      record(DeleteRange, name) { _ => bytes(begin); bytes(end) }
    def createColumnFamily(name: String): Unit = record(CreateCf, name)(_ => ())
    /** A family created again after this gets a new definition: its key schema may differ. */
    def dropColumnFamily(name: String): Unit = { record(DropCf, name)(_ => ()); cfs.remove(name) }

    /** Ends the log; the file is then complete. */
    def finish(): Unit = if (!closed) {
      out.writeByte(End)
      out.writeLong(tags)
      out.close()
      closed = true
    }

    /**
     * Drops the log: deletes the file unless a commit took it (moved it into the local cache).
     * Never fails: a log being discarded after a failed write cannot be flushed either.
     */
    override def close(): Unit = {
      if (!closed) {
        closed = true
        try out.close() catch { case NonFatal(_) => () }
      }
      file.delete()
    }
  }

  /**
   * Applies a changelog to `db`. `source` and `version` name the file in errors: a damaged log
   * fails the load, it is never applied in part silently.
   */
  def replay(file: File, db: LocalRocksDB, source: String, version: Long): Long = {
    def damaged(why: String, cause: Throwable = null): Nothing = throw KeyedStateErrors.fileCorrupt(
      s"State changelog $source of version $version is damaged: $why", cause)
    val raw = new BufferedInputStream(new FileInputStream(file), BlockSize)
    var in: DataInputStream = null
    try {
      val header = new DataInputStream(raw)
      if (header.readInt() != Magic) damaged("not a keyedstate changelog")
      val format = header.readByte()
      if (format != FormatVersion) damaged(s"format version $format, this build reads $FormatVersion")
      val codecId = header.readByte()
      val codec = Codec.all.find(_.id == codecId).getOrElse(
        damaged(s"unknown compression codec id $codecId (known: ${Codec.all.map(c => s"${c.id} ${c.name}").mkString(", ")})"))
      in = new DataInputStream(new BufferedInputStream(codec.decompress(raw), BlockSize))
      val records = new RecordReader(in, damaged(_, _)).applyTo(db)
      // Reading past the end makes the codec check its trailer (ZSTD's frame checksum, LZ4's end
      // block): a damaged byte that happened to read as the end marker is still caught.
      if (in.read() != -1) damaged("data after its end marker")
      records
    } catch {
      case e: CheckpointFileException => throw e
      case e: EOFException => damaged("it ends before its end marker (truncated)", e)
      case e: IOException => damaged(s"${e.getClass.getSimpleName}: ${e.getMessage}", e)
      // The codecs report damaged compressed data as runtime exceptions (LZ4Exception, ...).
      case e: RuntimeException if isCodecFailure(e) => damaged(s"${e.getClass.getSimpleName}: ${e.getMessage}", e)
    } finally {
      if (in != null) in.close() else raw.close()
    }
  }

  /**
   * Reads the records after the header and applies them to a database, in batches; checks the
   * recomputed key-group tags against the written checksum. `damaged` throws.
   */
  private final class RecordReader(in: DataInputStream, damaged: (String, Throwable) => Nothing) {
    // Per column family id: its name and, if its keys come without their tag, what recomputes it.
    private val families = mutable.HashMap[Int, (String, Option[Array[Byte] => Int])]()
    private var tags = 0L

    private def varint(): Int = {
      var v = 0
      var shift = 0
      var b = in.readByte()
      while ((b & 0x80) != 0) {
        if (shift > 28) damaged("malformed length", null)
        v |= (b & 0x7f) << shift; shift += 7; b = in.readByte()
      }
      v | (b << shift)
    }

    private def bytes(): Array[Byte] = {
      val n = varint()
      if (n < 0) damaged(s"negative field length $n", null)
      if (n <= BlockSize) { val b = new Array[Byte](n); in.readFully(b); b }
      else {
        // A damaged length must not allocate gigabytes: read what is there, in chunks.
        val b = in.readNBytes(n)
        if (b.length < n) throw new EOFException(s"field of $n bytes, ${b.length} left")
        b
      }
    }

    /** A stored key, its tag recomputed when the family's keys were written without it. */
    private def key(tagger: Option[Array[Byte] => Int]): Array[Byte] = tagger match {
      case None => bytes()
      case Some(tagOf) =>
        val k = bytes()
        val tag = try tagOf(k) catch {
          case NonFatal(e) => damaged(s"a key of ${k.length} bytes does not decode to compute its key-group tag", e)
        }
        tags = tagChecksum(tags, tag)
        KeyGroups.withTag(k, tag)
    }

    private def define(): Unit = {
      val id = varint()
      val name = in.readUTF()
      val tagger = in.readByte() match {
        case 0 => None
        case 1 =>
          val json = new String(bytes(), UTF_8)
          val rule = try KeyGroupRule.fromJson(json) catch {
            case NonFatal(e) => damaged(s"unreadable key-group rule of column family '$name'", e)
          }
          Some(rule.tagger())
        case other => damaged(s"unknown key form $other of column family '$name'", null)
      }
      families(id) = (name, tagger)
    }

    /** Applies every record up to the end marker; the number of records. */
    def applyTo(db: LocalRocksDB): Long = {
      val writes = db.batchedWrites()
      var records = 0L
      try {
        var op = in.readByte()
        while (op != End) {
          if (op == DefineCf) define()
          else {
            val id = varint()
            val (cf, tagger) = families.getOrElse(id, damaged(s"record refers to undefined column family $id", null))
            op match {
              case Put => writes.put(cf, key(tagger), bytes())
              case Merge => writes.merge(cf, key(tagger), bytes())
              case Delete => writes.delete(cf, key(tagger))
              case DeleteRange => writes.deleteRange(cf, bytes(), bytes())
              case CreateCf => writes.flush(); db.createColumnFamily(cf)
              case DropCf => writes.flush(); db.dropColumnFamily(cf)
              case other => damaged(s"unknown record type $other", null)
            }
            records += 1
          }
          op = in.readByte()
        }
        writes.flush()
      } finally writes.close()
      val written = in.readLong()
      if (written != tags) damaged(s"the key-group tags recomputed on replay (checksum $tags) differ from " +
        s"the ones written (checksum $written)", null)
      records
    }
  }

  private def isCodecFailure(e: RuntimeException): Boolean = {
    val cls = e.getClass.getName
    cls.startsWith("net.jpountz.") || cls.startsWith("com.github.luben.zstd.")
  }
}
