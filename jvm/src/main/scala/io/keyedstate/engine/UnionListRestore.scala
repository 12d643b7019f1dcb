package io.keyedstate.engine

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.catalyst.expressions.UnsafeRow

import io.keyedstate.checkpoint.{CheckpointStore, Transfers}
import io.keyedstate.shims.SparkTypes.StatefulOperatorStateInfo

/**
 * Flink's union redistribution of operator state (`get_union_list_state`), applied when a query
 * restores: in the first micro-batch of a run with committed state behind it, every partition gets
 * the lists of all partitions joined in partition order, whatever partition count wrote them (a
 * rescale or a restored savepoint keeps each old partition's list apart). The lists are read on
 * the driver from the manifests of the version the batch loads (`VersionManifest.partitionLocal`),
 * without opening a store; each task's lookup writes its copy before the function runs, and
 * every partition runs its function in that batch (also without input), so each snapshots its own
 * list as every Flink subtask does. Even-split state needs nothing here: at the same count
 * each partition keeps its list, and a change of count splits it when the state is rewritten.
 */
object UnionListRestore {
  private val ManifestReaders = 8

  /** Per union state's column family, the joined list as the family's value row (its bytes). */
  def read(spec: ProcessSpec, info: StatefulOperatorStateInfo,
      hadoopConf: Configuration): Map[String, Array[Byte]] = {
    val operatorDir = new Path(info.checkpointLocation, info.operatorId.toString)
    if (spec.unionStates.isEmpty || info.storeVersion == 0 ||
        !operatorDir.getFileSystem(hadoopConf).exists(operatorDir)) return Map.empty
    val manifests = Transfers.parallel(0 until info.numPartitions, ManifestReaders) { p =>
      val checkpointId = info.stateStoreCkptIds.flatMap(_.lift(p)).flatMap(_.headOption)
      new CheckpointStore(new Path(operatorDir, p.toString), hadoopConf).readManifest(info.storeVersion, checkpointId)
    }
    spec.unionStates.map { case (v, _) =>
      val codec = OperatorLists.codec(v)
      val lists = manifests.flatMap(_.partitionLocal.getOrElse(v.columnFamily, Nil)).map(e => codec.decode(e.keyBytes, e.valueBytes))
      v.columnFamily -> codec.valueRow(lists.sortBy(_._1).flatMap(_._2)).getBytes
    }.toMap
  }

  /** The value row of [[read]]'s bytes. */
  def row(bytes: Array[Byte]): UnsafeRow = {
    val row = new UnsafeRow(1)
    row.pointTo(bytes, bytes.length)
    row
  }
}

