package io.keyedstate

import org.scalatest.Assertions

/** Waits (up to 30 s) for what another thread does, checking every 5 ms. */
object Eventually {
  def eventually(condition: => Boolean): Unit = {
    val deadline = System.nanoTime() + 30L * 1000 * 1000 * 1000
    while (!condition) {
      Assertions.assert(System.nanoTime() < deadline, "timed out")
      Thread.sleep(5)
    }
  }
}
