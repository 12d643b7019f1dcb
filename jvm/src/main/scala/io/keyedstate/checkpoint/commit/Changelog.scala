package io.keyedstate.checkpoint.commit

import java.io._

import scala.collection.mutable
import scala.util.control.NonFatal

import com.github.luben.zstd.{RecyclingBufferPool, ZstdInputStreamNoFinalizer, ZstdOutputStreamNoFinalizer}
import net.jpountz.lz4.LZ4BlockOutputStream

import io.keyedstate.checkpoint.LocalFileOutput
import io.keyedstate.errors.{CheckpointFileException, KeyedStateErrors}
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.shims.SparkShims

/**
 * The changes of one version, as a replayable log: what a commit uploads between snapshots.
 *
 * Format 4: an uncompressed header (magic, format version, codec id), so a reader never guesses
 * the codec; then, compressed with that codec, records `[op][cf id][fields]` and an end marker,
 * so a truncated file is detected on replay. Ids and lengths are unsigned varints (a key or a
 * value length is one byte for rows under 128 bytes). A column family is named once per file
 * (`DefineCf`) and referred to by its small id afterwards. Keys and values are the stored bytes
 * (most stored keys carry no key-group tag: see `rocks.KeyGroups`). The codecs' own checks
 * (LZ4's block checksums, ZSTD's frame checksum) come on top of the CRC32C the manifest keeps of
 * the file.
 */
object Changelog {
  private val Magic = 0x4b534c47 // "KSLG"
  val FormatVersion = 4

  private val DefineCf: Byte = 0
  private val Put: Byte = 1
  private val Delete: Byte = 2
  private val Merge: Byte = 3
  private val DeleteRange: Byte = 4
  private val CreateCf: Byte = 5
  private val DropCf: Byte = 6
  private val End: Byte = 127

  /** A compression codec of the record stream; `id` is what the header records. */
  sealed abstract class Compression(val id: Byte, val name: String) {
    def compress(out: OutputStream): OutputStream
    def decompress(in: InputStream): InputStream
  }
  object Compression {
    case object NoCompression extends Compression(0, "none") {
      def compress(out: OutputStream): OutputStream = out
      def decompress(in: InputStream): InputStream = in
    }
    case object Lz4 extends Compression(1, "lz4") {
      def compress(out: OutputStream): OutputStream = new LZ4BlockOutputStream(out, BlockSize)
      def decompress(in: InputStream): InputStream = SparkShims.lz4Input(in)
    }
    /** Level 3, zstd's default: the changelog is written once per version and read only on a load. */
    case object Zstd extends Compression(2, "zstd") {
      def compress(out: OutputStream): OutputStream =
        new ZstdOutputStreamNoFinalizer(out, RecyclingBufferPool.INSTANCE).setLevel(3).setChecksum(true)
      def decompress(in: InputStream): InputStream =
        new ZstdInputStreamNoFinalizer(in, RecyclingBufferPool.INSTANCE).setContinuous(false)
    }
    val all: Seq[Compression] = Seq(NoCompression, Lz4, Zstd)
    def named(name: String): Compression =
      all.find(_.name == name).getOrElse(throw KeyedStateErrors.invalidOption(s"Unknown changelog codec '$name'"))
  }

  private val BlockSize = 1 << 16

  /**
   * Records one version's writes to a local file, compressed with `codec`. A failed write of the
   * file (a full local disk) is a `LocalDiskException` naming it, thrown by the write that met it.
   */
  final class Writer(val file: File, codec: Compression = Compression.Zstd) extends AutoCloseable {
    private val out = {
      val raw = new BufferedOutputStream(new LocalFileOutput(file, "the state changelog"), BlockSize)
      val header = new DataOutputStream(raw)
      header.writeInt(Magic)
      header.writeByte(FormatVersion)
      header.writeByte(codec.id) // buffered with the records: a full disk fails the first block's write
      codec.compress(raw)
    }
    // Records are encoded here and handed to the codec a block at a time: a record is a few
    // single bytes, and each `write` of a byte to a JDK stream takes the stream's lock.
    private val block = new Array[Byte](BlockSize)
    private var used = 0
    private val cfs = mutable.HashMap[String, Int]()
    private var nextId = 0
    private var records = 0L
    private var closed = false

    def numRecords: Long = records

    private def drain(): Unit = { out.write(block, 0, used); used = 0 }
    private def byte(b: Int): Unit = {
      if (used == block.length) drain()
      block(used) = b.toByte
      used += 1
    }
    private def varint(v: Int): Unit = {
      var rest = v
      while ((rest & ~0x7f) != 0) { byte((rest & 0x7f) | 0x80); rest >>>= 7 }
      byte(rest)
    }
    private def raw(b: Array[Byte]): Unit =
      if (b.length <= block.length - used) { System.arraycopy(b, 0, block, used, b.length); used += b.length }
      else { drain(); if (b.length < block.length) raw(b) else out.write(b) }
    private def cf(name: String): Int = cfs.getOrElse(name, {
      val id = nextId
      nextId += 1
      val utf = new ByteArrayOutputStream()
      new DataOutputStream(utf).writeUTF(name) // what replay's readUTF reads
      byte(DefineCf); varint(id); raw(utf.toByteArray)
      cfs(name) = id
      id
    })
    private def bytes(b: Array[Byte]): Unit = { varint(b.length); raw(b) }
    private def record(op: Byte, name: String): Unit = {
      val id = cf(name)
      byte(op); varint(id)
      records += 1
    }

    def put(name: String, k: Array[Byte], value: Array[Byte]): Unit = { record(Put, name); bytes(k); bytes(value) }
    def merge(name: String, k: Array[Byte], value: Array[Byte]): Unit = { record(Merge, name); bytes(k); bytes(value) }
    def delete(name: String, k: Array[Byte]): Unit = { record(Delete, name); bytes(k) }
    def deleteRange(name: String, begin: Array[Byte], end: Array[Byte]): Unit = {
      record(DeleteRange, name); bytes(begin); bytes(end)
    }
    def createColumnFamily(name: String): Unit = record(CreateCf, name)
    def dropColumnFamily(name: String): Unit = record(DropCf, name)

    /** Ends the log; the file is then complete. */
    def finish(): Unit = if (!closed) {
      byte(End)
      drain()
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
      val codec = Compression.all.find(_.id == codecId).getOrElse(
        damaged(s"unknown compression codec id $codecId (known: ${Compression.all.map(c => s"${c.id} ${c.name}").mkString(", ")})"))
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

  /** Reads the records after the header and applies them to a database, in batches. `damaged` throws. */
  private final class RecordReader(in: DataInputStream, damaged: (String, Throwable) => Nothing) {
    private val families = mutable.HashMap[Int, String]()

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

    /** Applies every record up to the end marker; the number of records. */
    def applyTo(db: LocalRocksDB): Long = {
      var records = 0L
      var op = in.readByte()
      while (op != End) {
        if (op == DefineCf) { val id = varint(); families(id) = in.readUTF() }
        else {
          val id = varint()
          val cf = families.getOrElse(id, damaged(s"record refers to undefined column family $id", null))
          op match {
            case Put => db.put(cf, bytes(), bytes())
            case Merge => db.merge(cf, bytes(), bytes())
            case Delete => db.delete(cf, bytes())
            case DeleteRange => db.deleteRange(cf, bytes(), bytes())
            case CreateCf => db.createColumnFamily(cf)
            case DropCf => db.dropColumnFamily(cf)
            case other => damaged(s"unknown record type $other", null)
          }
          records += 1
        }
        op = in.readByte()
      }
      records
    }
  }

  private def isCodecFailure(e: RuntimeException): Boolean = {
    val cls = e.getClass.getName
    cls.startsWith("net.jpountz.") || cls.startsWith("com.github.luben.zstd.")
  }
}
