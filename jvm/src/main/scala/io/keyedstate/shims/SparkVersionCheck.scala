package io.keyedstate.shims

import org.apache.spark.SPARK_VERSION

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * The Spark minor version this jar was built for against the one running. A jar of another
 * version would fail later, on the first method that version lacks; this names both versions
 * at the provider's and the session extensions' start instead.
 */
object SparkVersionCheck {
  /** The Spark minor versions keyedstate builds a jar for (build.sbt's `supportedSparkMinors`). */
  val Supported: Seq[String] = Seq("4.0", "4.1", "4.2", "4.3")

  val running: String = SPARK_VERSION.split('.').take(2).mkString(".")

  def check(): Unit = if (running != SparkShims.SparkMinor) {
    val instead =
      if (Supported.contains(running))
        s"use keyedstate-spark-$running.jar (`keyedstate jar --spark-version $running` prints its path)"
      else s"keyedstate has jars for Spark ${Supported.init.mkString(", ")} and ${Supported.last} only"
    throw KeyedStateErrors.unsupported(ErrorId.UnsupportedSparkVersion,
      s"This keyedstate jar is for Spark ${SparkShims.SparkMinor}, and Spark $SPARK_VERSION runs: $instead")
  }
}
