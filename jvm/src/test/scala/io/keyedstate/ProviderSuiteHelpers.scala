package io.keyedstate

import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.Assertions

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{CheckpointFileException, ErrorFamily, ErrorId}

/**
 * What the suites of the provider's contract share, over [[ProviderFixture]]: a version committed
 * in one call, snapshot mode, and a failure's Spark condition with keyedstate's message.
 */
trait ProviderSuiteHelpers extends ProviderFixture with Assertions {
  def commitWith(p: StateStoreProvider, version: Long)(f: StateStore => Unit): Long = {
    val s = p.getStore(version)
    f(s)
    s.commit()
  }

  val snapshotMode: StateStoreConf = storeConf(KeyedStateConf.Prefix + "changelogCheckpointing" -> "false")

  def condition(e: Throwable): String = e match {
    case spark: org.apache.spark.SparkThrowable => spark.getCondition
    case other => fail(s"not a Spark error: $other")
  }

  /** A failure's Spark error condition, and keyedstate's own message found among its causes. */
  def sparkFailure(f: => Any): (String, String) = {
    val e = intercept[Exception](f)
    val ours = Iterator.iterate[Throwable](e)(_.getCause).takeWhile(_ != null)
      .collectFirst { case c: CheckpointFileException => c }
      .getOrElse(fail(s"no keyedstate message under $e"))
    // Spark's class outside, keyedstate's identifier first in its own line.
    assert(ours.getMessage == s"[${ours.errorId}] ${ours.detail}", ours.getMessage)
    assert(ErrorId.named(ours.errorId).exists(_.family == ErrorFamily.Checkpoint), ours.errorId)
    (condition(e), ours.getMessage)
  }
}
