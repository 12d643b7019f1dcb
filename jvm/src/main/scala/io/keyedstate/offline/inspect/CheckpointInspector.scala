package io.keyedstate.offline.inspect

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

import io.keyedstate.checkpoint.CheckpointStore
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.rocks.KeyGroups
import io.keyedstate.offline.{OfflineJob, QueryCheckpoint, StoreRef, StoreVersions}

/** One store partition: its keys and bytes, and how they spread over the key groups. */
final case class PartitionReport(
    operatorId: Int,
    storeName: String,
    partition: Int,
    version: Long,
    keys: Long,
    fileBytes: Long,
    dataBytes: Long,
    keyGroupKeys: Seq[Long],
    keyGroupBytes: Seq[Long],
    /** The heaviest key group's bytes over the mean of the non-empty ones (1.0 = even). */
    keyGroupSkew: Double,
    misplacedKeys: Long)

final case class OperatorReport(
    operatorId: Int,
    operatorName: String,
    /** The keyed function that wrote the state, and the uid it was given (empty for Spark's operators). */
    function: String,
    uid: String,
    stores: Seq[String],
    keys: Long,
    fileBytes: Long,
    partitionSkew: Double,
    keyGroupSkew: Double)

final case class InspectReport(
    checkpoint: String,
    batchId: Long,
    stateVersion: Long,
    partitions: Int,
    provider: String,
    keyGroups: Int,
    operators: Seq[OperatorReport],
    partitionReports: Seq[PartitionReport])

object InspectReport {
  def skew(values: Seq[Long]): Double = {
    val nonEmpty = values.filter(_ > 0)
    if (nonEmpty.isEmpty) 1.0 else nonEmpty.max.toDouble / (nonEmpty.sum.toDouble / nonEmpty.size)
  }
}

/**
 * `keyedstate inspect`: per operator and partition, the keys and bytes of the state of the last
 * committed batch, and their spread over key groups (`pmod(tag, keyGroups)`: the unit a rescale
 * moves). Reads every key as a Spark job (one task per store partition); decodes no value.
 */
final class CheckpointInspector(spark: SparkSession, keyGroups: Int) {
  import QueryCheckpoint._

  def inspect(checkpoint: String): InspectReport = {
    val hadoopConf = QueryCheckpoint.hadoopConf(spark)
    val ckpt = QueryCheckpoint.at(checkpoint, hadoopConf)
    val batch = ckpt.lastCommit()
    ckpt.requireKeyedStateProvider(batch, "inspect")
    val pinned = ckpt.pinnedConf(batch)
    val partitions = pinned.get(PartitionsKey).flatMap(_.toIntOption).getOrElse(0)
    val version = batch + 1
    val tasks = for {
      op <- ckpt.operators
      // Checkpoint format v2: each store version is named by the id the commit recorded.
      ids = checkpointIds(ckpt, batch, op)
      store <- ckpt.storeNames(op, 0)
      p <- ckpt.partitions(op)
    } yield (StoreRef(op, store, p), ckpt.storeDir(StoreRef(op, store, p)).toString, ids.get(p))
    val settings = OfflineJob.hadoopSettings(hadoopConf)
    val conf = KeyedStateConf.fromMap(spark.conf.getAll)
    val groups = keyGroups
    spark.sparkContext.setJobDescription(s"keyedstate inspect ${ckpt.root}")
    val reports = spark.sparkContext.parallelize(tasks, math.max(1, tasks.size)).map { case (ref, dir, id) =>
      CheckpointInspector.scan(ref, dir, version, id, partitions, groups, settings, conf)
    }.collect().toSeq.sortBy(r => (r.operatorId, r.storeName, r.partition))
    val operators = reports.groupBy(_.operatorId).toSeq.sortBy(_._1).map { case (op, rs) =>
      val perPartition = rs.groupBy(_.partition).values.map(_.map(_.keys).sum).toSeq
      val perGroup = rs.map(_.keyGroupBytes).transpose.map(_.sum)
      val declared = rs.find(r => r.partition == 0 && r.storeName == StateStoreId.DEFAULT_STORE_NAME)
        .map(_ => new CheckpointStore(ckpt.storeDir(StoreRef(op, StateStoreId.DEFAULT_STORE_NAME, 0)), hadoopConf)
          .readManifest(version, checkpointIds(ckpt, batch, op).get(0)))
      OperatorReport(op, ckpt.operatorName(op), declared.flatMap(_.declaredFunction).getOrElse(""),
        declared.flatMap(_.declaredUid).getOrElse(""), rs.map(_.storeName).distinct, rs.map(_.keys).sum,
        rs.map(_.fileBytes).sum, InspectReport.skew(perPartition), InspectReport.skew(perGroup))
    }
    InspectReport(ckpt.root.toString, batch, version, partitions, OurProvider, keyGroups, operators, reports)
  }

  /** The default store's checkpoint id per partition (format v2); other stores are refused. */
  private def checkpointIds(ckpt: QueryCheckpoint, batch: Long, op: Int): Map[Int, String] = {
    val ids = ckpt.defaultStoreCheckpointIds(batch, op, ckpt.partitions(op))
    if (ids.nonEmpty && ckpt.storeNames(op, 0).exists(_ != StateStoreId.DEFAULT_STORE_NAME)) {
      throw KeyedStateErrors.unsupported(ErrorId.QueryCheckpointInvalid,
        s"operator $op of ${ckpt.root} keeps several state stores (a stream-stream join) and its commits record " +
          "state checkpoint ids (checkpoint format v2): inspect reads such an operator with format v1 only")
    }
    ids
  }

}

object CheckpointInspector {
  private implicit val formats: Formats = DefaultFormats

  val MaxKeyGroups: Int = 1 << 16

  def scan(
      ref: StoreRef,
      dir: String,
      version: Long,
      checkpointId: Option[String],
      partitions: Int,
      keyGroups: Int,
      settings: Map[String, String],
      conf: KeyedStateConf): PartitionReport =
    StoreVersions.open(ref, dir, version, settings, conf, checkpointId) { (_, manifest, db, _) =>
      val keys = new Array[Long](keyGroups)
      val bytes = new Array[Long](keyGroups)
      var misplaced = 0L
      manifest.columnFamilies.filter(cf => db.hasColumnFamily(cf.name)).foreach { cf =>
        val tagOf = StoreVersions.tagReader(ref, cf, version)
        val keyGrouped = KeyGroups.isKeyGrouped(cf.name)
        val it = db.scan(cf.name, None, None)
        try it.foreach { case (k, v) =>
          val tag = tagOf(k)
          val g = KeyGroups.owner(tag, keyGroups)
          keys(g) += 1
          bytes(g) += k.length + v.length
          if (keyGrouped && partitions > 0 && KeyGroups.owner(tag, partitions) != ref.partition) misplaced += 1
        } finally it.close()
      }
      PartitionReport(ref.operatorId, ref.storeName, ref.partition, version, keys.sum, manifest.totalBytes,
        bytes.sum, keys.toSeq, bytes.toSeq, InspectReport.skew(bytes.toSeq), misplaced)
    }

  /** The entry point of the Python package and the CLI: the report as JSON. */
  def report(spark: SparkSession, checkpoint: String, keyGroups: Int): String = {
    if (keyGroups < 1 || keyGroups > MaxKeyGroups) {
      throw KeyedStateErrors.badArgument(ErrorId.InvalidOption,
        s"Invalid key group count $keyGroups for inspect: allowed is an integer from 1 to $MaxKeyGroups")
    }
    Serialization.write(new CheckpointInspector(spark, keyGroups).inspect(checkpoint))
  }
}
