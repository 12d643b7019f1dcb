package io.keyedstate.checkpoint.commit

import java.io._

import scala.collection.mutable
import scala.util.control.NonFatal

import net.jpountz.lz4.{LZ4BlockInputStream, LZ4BlockOutputStream}

import io.keyedstate.checkpoint.LocalFileOutput
import io.keyedstate.conf.CheckpointFileException
import io.keyedstate.rocks.LocalRocksDB

/**
 * The changes of one version, as a replayable log: what a commit uploads between snapshots.
 *
 * Format: a header (magic, format version), then records `[op][cf id][fields]` in LZ4 blocks,
 * then an end marker, so a truncated file is detected on replay. A column family is named once
 * per file (`DefineCf`) and referred to by a small id afterwards.
 */
object Changelog {
  private val Magic = 0x4b534c47 // "KSLG"
  private val FormatVersion = 1

  private val DefineCf: Byte = 0
  private val Put: Byte = 1
  private val Delete: Byte = 2
  private val Merge: Byte = 3
  private val DeleteRange: Byte = 4
  private val CreateCf: Byte = 5
  private val DropCf: Byte = 6
  private val End: Byte = 127

  /**
   * Records one version's writes to a local file. A failed write of the file (a full local disk)
   * is a `LocalDiskException` naming it, thrown by the write that met it.
   */
  final class Writer(val file: File) extends AutoCloseable {
    private val out = new DataOutputStream(new LZ4BlockOutputStream(
      new BufferedOutputStream(new LocalFileOutput(file, "the state changelog"), 1 << 16), 1 << 16))
    private val cfIds = mutable.Map[String, Int]()
    private var records = 0L
    private var closed = false
    out.writeInt(Magic)
    out.writeByte(FormatVersion)

    def numRecords: Long = records

    private def cf(name: String): Int = cfIds.getOrElseUpdate(name, {
      val id = cfIds.size
      out.writeByte(DefineCf); out.writeInt(id); out.writeUTF(name)
      id
    })
    private def bytes(b: Array[Byte]): Unit = { out.writeInt(b.length); out.write(b) }
    private def record(op: Byte, name: String)(fields: => Unit): Unit = {
      val id = cf(name)
      out.writeByte(op); out.writeInt(id)
      fields
      records += 1
    }

    def put(name: String, key: Array[Byte], value: Array[Byte]): Unit = record(Put, name) { bytes(key); bytes(value) }
    def merge(name: String, key: Array[Byte], value: Array[Byte]): Unit = record(Merge, name) { bytes(key); bytes(value) }
    def delete(name: String, key: Array[Byte]): Unit = record(Delete, name)(bytes(key))
    def deleteRange(name: String, begin: Array[Byte], end: Array[Byte]): Unit =
      record(DeleteRange, name) { bytes(begin); bytes(end) }
    def createColumnFamily(name: String): Unit = record(CreateCf, name)(())
    def dropColumnFamily(name: String): Unit = record(DropCf, name)(())

    /** Ends the log; the file is then complete. */
    def finish(): Unit = if (!closed) {
      out.writeByte(End)
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
    def damaged(why: String, cause: Throwable = null): Nothing = throw new CheckpointFileException(
      s"State changelog $source of version $version is damaged: $why", cause)
    val in = new DataInputStream(LZ4BlockInputStream.newBuilder()
      .build(new BufferedInputStream(new FileInputStream(file), 1 << 16)))
    try {
      if (in.readInt() != Magic) damaged("not a keyedstate changelog")
      val format = in.readByte()
      if (format != FormatVersion) damaged(s"format version $format, this build reads $FormatVersion")
      val names = mutable.Map[Int, String]()
      def bytes(): Array[Byte] = { val b = new Array[Byte](in.readInt()); in.readFully(b); b }
      var records = 0L
      var op = in.readByte()
      while (op != End) {
        if (op == DefineCf) {
          val id = in.readInt()
          names(id) = in.readUTF()
        } else {
          val id = in.readInt()
          val cf = names.getOrElse(id, damaged(s"record refers to undefined column family $id"))
          op match {
            case Put => db.put(cf, bytes(), bytes())
            case Merge => db.merge(cf, bytes(), bytes())
            case Delete => db.delete(cf, bytes())
            case DeleteRange => db.deleteRange(cf, bytes(), bytes())
            case CreateCf => db.createColumnFamily(cf)
            case DropCf => db.dropColumnFamily(cf)
            case other => damaged(s"unknown record type $other")
          }
          records += 1
        }
        op = in.readByte()
      }
      records
    } catch {
      case e: EOFException => damaged("it ends before its end marker (truncated)", e)
      case e: IOException if !e.isInstanceOf[CheckpointFileException] => damaged(e.getMessage, e)
    } finally in.close()
  }
}
