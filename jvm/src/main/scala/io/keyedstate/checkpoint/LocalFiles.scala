package io.keyedstate.checkpoint

import java.io.File
import java.util.concurrent.TimeUnit

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
}
