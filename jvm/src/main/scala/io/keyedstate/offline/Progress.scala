package io.keyedstate.offline

import org.apache.spark.internal.Logging

/** The progress of an offline operation: on stderr for the user of the CLI, and in Spark's log. */
object Progress extends Logging {
  def of(operation: String): String => Unit = { message =>
    logInfo(s"keyedstate $operation: $message")
    System.err.println(s"[keyedstate $operation] $message")
  }
}
