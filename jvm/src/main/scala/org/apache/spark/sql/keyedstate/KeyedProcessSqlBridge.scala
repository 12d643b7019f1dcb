package org.apache.spark.sql.keyedstate

import java.util.UUID

import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.catalyst.expressions.Expression
import org.apache.spark.sql.catalyst.optimizer.NormalizeFloatingNumbers
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.classic.{Dataset => ClassicDataset, SparkSession => ClassicSession}
import org.apache.spark.sql.types.DataType

import io.keyedstate.shims.SparkTypes.{IncrementalExecution, MicroBatchExecution, StreamExecution}

/**
 * keyedstate's keyed-process operator uses a few `private[sql]` members: building a DataFrame
 * from a logical plan, normalizing float keys as Spark's grouping does, and finding the
 * micro-batch being planned (Spark's own stateful operators
 * get their state info from rules that match only Spark's classes). Kept this small on purpose;
 * see ../shared reference "python-engine-on-spark-4.3".
 */
object KeyedProcessSqlBridge {
  def ofRows(session: SparkSession, plan: LogicalPlan): DataFrame =
    ClassicDataset.ofRows(session.asInstanceOf[ClassicSession], plan)

  def logicalPlan(df: DataFrame): LogicalPlan = df.asInstanceOf[ClassicDataset[_]].logicalPlan

  /** Whether values of `dataType` hold floats or doubles that Spark's grouping normalizes. */
  def needsFloatNormalization(dataType: DataType): Boolean = NormalizeFloatingNumbers.needNormalize(dataType)

  /** `expr` with -0.0 as 0.0 and every NaN as one NaN, nested values too (Spark's grouping keys). */
  def normalizeFloats(expr: Expression): Expression = NormalizeFloatingNumbers.normalize(expr)

  /**
   * The micro-batch execution being planned on this thread, if this thread is a streaming
   * query's: Spark sets the query id and batch id as local properties before planning a batch,
   * and `lastExecution` is already the execution being planned. Checked by batch id: fails closed.
   */
  def currentIncrementalExecution(session: SparkSession): Option[IncrementalExecution] = {
    val sc = session.sparkContext
    val queryId = Option(sc.getLocalProperty(StreamExecution.QUERY_ID_KEY))
    val batchId = Option(sc.getLocalProperty(MicroBatchExecution.BATCH_ID_KEY)).map(_.toLong)
    for {
      q <- queryId
      b <- batchId
      stream <- Option(session.asInstanceOf[ClassicSession].sharedState.activeStreamingQueries
        .get(UUID.fromString(q)))
      exec <- Option(stream.lastExecution)
      if exec.currentBatchId == b
    } yield exec
  }

  def numStateStores(exec: IncrementalExecution): Int = exec.numStateStores

  /** The session's SQL configuration with `pinned` settings (a checkpoint's offset log) on top. */
  def sqlConfWith(session: SparkSession, pinned: Map[String, String]): org.apache.spark.sql.internal.SQLConf = {
    val conf = session.asInstanceOf[ClassicSession].sessionState.conf.clone()
    pinned.foreach { case (k, v) => conf.setConfString(k, v) }
    conf
  }

  def internalCreateDataFrame(session: SparkSession, rdd: org.apache.spark.rdd.RDD[org.apache.spark.sql.catalyst.InternalRow],
      schema: org.apache.spark.sql.types.StructType): DataFrame =
    session.asInstanceOf[ClassicSession].internalCreateDataFrame(rdd, schema)

  /** A DataFrame's rows as Spark computes them internally (no conversion to external rows). */
  def internalRows(df: DataFrame): org.apache.spark.rdd.RDD[org.apache.spark.sql.catalyst.InternalRow] =
    df.asInstanceOf[ClassicDataset[_]].queryExecution.toRdd

  def hadoopConf(session: SparkSession): org.apache.hadoop.conf.Configuration =
    session.asInstanceOf[ClassicSession].sessionState.newHadoopConf()
}

/**
 * The partitions of `parent`, computed with SQL settings changed for this RDD only: a Python
 * runner in `parent`'s stage reads Spark's SQL configuration when the partition is computed.
 * keyedstate's keyed runner bounds its input batches by rows: Spark's byte bound measures every
 * Arrow vector after every row, which cost more than writing the rows did.
 */
final class SqlConfScopedRDD[T: scala.reflect.ClassTag](
    parent: org.apache.spark.rdd.RDD[T],
    settings: Map[String, String]) extends org.apache.spark.rdd.RDD[T](parent) {

  override protected def getPartitions: Array[org.apache.spark.Partition] = parent.partitions

  override def compute(split: org.apache.spark.Partition, context: org.apache.spark.TaskContext): Iterator[T] = {
    // A task's SQLConf is read-only and cannot be cloned: copy its settings.
    val scoped = new org.apache.spark.sql.internal.SQLConf
    org.apache.spark.sql.internal.SQLConf.get.getAllConfs.foreach { case (k, v) => scoped.setConfString(k, v) }
    settings.foreach { case (k, v) => scoped.setConfString(k, v) }
    org.apache.spark.sql.internal.SQLConf.withExistingConf(scoped) { parent.iterator(split, context) }
  }
}
