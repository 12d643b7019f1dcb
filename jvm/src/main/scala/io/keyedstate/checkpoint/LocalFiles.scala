package io.keyedstate.checkpoint

import java.io.{File, FileOutputStream, IOException, OutputStream}
import java.util.concurrent.TimeUnit

import io.keyedstate.errors.KeyedStateErrors
import io.keyedstate.conf.KeyedStateConf

private[keyedstate] object LocalFiles {
  def deleteRecursively(f: File): Unit = {
    if (f.isDirectory) Option(f.listFiles()).getOrElse(Array.empty[File]).foreach(deleteRecursively)
    f.delete()
  }

  def timed(body: => Unit): Long = {
    val start = System.nanoTime()
    body
    TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start)
  }

  /**
   * Runs `body`, which writes `file` on the local disk; an I/O failure names the file (`what`),
   * except a `NoSuchFileException`, which callers take for a source that vanished.
   */
  def writing[T](what: String, file: File)(body: => T): T =
    try body
    catch {
      case e: IOException if !e.isInstanceOf[java.nio.file.NoSuchFileException] =>
        throw KeyedStateErrors.localDiskWrite(what, file, KeyedStateConf.localDirOf(file), KeyedStateConf.LocalDirKey, e)
    }
}

/**
 * A new file on the executor's local disk (a changelog being recorded, a download): a failed
 * write (a full disk above all) is a `LocalDiskException` naming the file and the local directory,
 * never a bare "No space left on device", nor taken for a damaged checkpoint file.
 */
private[keyedstate] final class LocalFileOutput(file: File, what: String) extends OutputStream {
  private val out = LocalFiles.writing(what, file)(new FileOutputStream(file))

  override def write(b: Int): Unit = LocalFiles.writing(what, file)(out.write(b))
  override def write(b: Array[Byte], off: Int, len: Int): Unit = LocalFiles.writing(what, file)(out.write(b, off, len))
  override def flush(): Unit = LocalFiles.writing(what, file)(out.flush())
  override def close(): Unit = LocalFiles.writing(what, file)(out.close())
}
