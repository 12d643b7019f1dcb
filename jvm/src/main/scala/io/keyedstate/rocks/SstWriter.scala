package io.keyedstate.rocks

import java.io.File

import org.rocksdb.{EnvOptions, Options, SstFileWriter}

import io.keyedstate.conf.KeyedStateConf

/**
 * Writes one SST file of key-ordered entries for bulk ingestion ([[LocalRocksDB.ingest]]).
 * Nothing is written for an empty writer: `finish()` returns the entry count, 0 meaning no file.
 * It closes the `options` it is given.
 */
final class SstWriter(val file: File, options: Options) extends AutoCloseable {
  /** A file with the default table options and the configured compression (rescale's). */
  def this(file: File, conf: KeyedStateConf) =
    this(file, new Options().setCompressionType(RocksDBResources.compressionType(conf.compression)))

  private val envOptions = new EnvOptions()
  private val writer = new SstFileWriter(envOptions, options)
  private var opened = false
  private var count = 0L

  def put(key: Array[Byte], value: Array[Byte]): Unit = { open(); writer.put(key, value); count += 1 }
  def merge(key: Array[Byte], operand: Array[Byte]): Unit = { open(); writer.merge(key, operand); count += 1 }
  def delete(key: Array[Byte]): Unit = { open(); writer.delete(key); count += 1 }

  private def open(): Unit = if (!opened) { writer.open(file.getAbsolutePath); opened = true }

  def entries: Long = count

  def finish(): Long = {
    if (opened) writer.finish()
    count
  }

  override def close(): Unit = {
    writer.close()
    options.close()
    envOptions.close()
  }
}

