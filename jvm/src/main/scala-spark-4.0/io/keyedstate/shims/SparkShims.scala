package io.keyedstate.shims

import org.apache.spark.sql.catalyst.expressions.UnsafeRow

/** What keyedstate calls differently on each Spark minor version, for Spark 4.0 (see the 4.3 one). */
object SparkShims extends SparkShimsBefore42 {
  val SparkMinor: String = "4.0"
}

/** keyedstate's store as Spark 4.0 sees it: 4.0's stores also lack 4.1's lists and read-store release. */
trait StoreShim extends StoreShimBefore42 {
  def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit
  def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit
  def release(): Unit
}

/** keyedstate's provider as Spark 4.0 runs it: 4.0 never upgrades a read store (see KeyedStateStoreProvider.getStore). */
trait ProviderShim extends ProviderShimBefore42
