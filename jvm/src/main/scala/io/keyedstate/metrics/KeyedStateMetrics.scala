package io.keyedstate.metrics

import org.apache.spark.sql.execution.streaming.state.{StateStoreCustomMetric, StateStoreCustomSizeMetric, StateStoreCustomSumMetric, StateStoreCustomTimingMetric}

import io.keyedstate.checkpoint.commit.CommitStats
import io.keyedstate.shims.SparkShims
import io.keyedstate.checkpoint.restore.LoadStats
import io.keyedstate.ttl.TtlStats

/**
 * The provider's custom metrics. Spark sums each over the partitions of an operator and shows
 * it in `StreamingQueryProgress.stateOperators[].customMetrics` under the name below. A
 * "snapshot" metric (`isSnapshot`) describes the state rather than the batch: a progress for a
 * trigger that ran no batch keeps its value instead of zero, as with Spark's RocksDB provider.
 *
 * The instance metric (Spark 4.1 and later, shims.StoreApi) is per store instance, as Spark's
 * providers report it: `SnapshotLastUploaded.partition_<p>_<store>`, the last version whose
 * snapshot this instance made durable (-1 before its first), the partitions furthest behind
 * shown in the progress (`spark.sql.streaming.stateStore.numStateStoreInstanceMetricsToReport`).
 */
object KeyedStateMetrics {
  val CommitFlushMs = StateStoreCustomTimingMetric("keyedstateCommitFlushMs", "keyedstate commit: memtable flush time")
  val CommitCheckpointMs = StateStoreCustomTimingMetric("keyedstateCommitCheckpointMs", "keyedstate commit: RocksDB checkpoint time")
  val CommitUploadMs = StateStoreCustomTimingMetric("keyedstateCommitUploadMs", "keyedstate commit: file upload time")
  val CommitManifestMs = StateStoreCustomTimingMetric("keyedstateCommitManifestMs", "keyedstate commit: manifest write time")
  val CommitBytesUploaded = StateStoreCustomSizeMetric("keyedstateCommitBytesUploaded", "keyedstate commit: bytes uploaded")
  val CommitFilesUploaded = StateStoreCustomSumMetric("keyedstateCommitFilesUploaded", "keyedstate commit: files uploaded")
  val CommitFilesReused = StateStoreCustomSumMetric("keyedstateCommitFilesReused", "keyedstate commit: files shared with the previous version")
  val CommitChangelogRecords = StateStoreCustomSumMetric("keyedstateCommitChangelogRecords", "keyedstate commit: changelog records written")
  val SnapshotBytesUploaded = StateStoreCustomSizeMetric("keyedstateSnapshotBytesUploaded", "keyedstate: bytes of background snapshots that completed")
  val LoadMs = StateStoreCustomTimingMetric("keyedstateLoadMs", "keyedstate load: time to restore a version from the checkpoint")
  val LoadBytesDownloaded = StateStoreCustomSizeMetric("keyedstateLoadBytesDownloaded", "keyedstate load: bytes downloaded")
  val LoadChangelogRecordsReplayed = StateStoreCustomSumMetric("keyedstateLoadChangelogRecordsReplayed", "keyedstate load: changelog records replayed")
  val LoadFilesReusedLocally = StateStoreCustomSumMetric("keyedstateLoadFilesReusedLocally", "keyedstate load: files reused from local disk")
  val SstFilesBytes = SparkShims.stateSizeMetric("keyedstateSstFilesBytes", "keyedstate: live SST bytes")
  val SnapshotsTaken = StateStoreCustomSumMetric("keyedstateSnapshotsTaken", "keyedstate commit: number of stores whose commit took a snapshot")
  val BackgroundFlushes = StateStoreCustomSumMetric("keyedstateBackgroundFlushes",
    "keyedstate commit: number of stores whose commit started a memtable flush for the next commit's snapshot")
  // Spark's providers report the same as rocksdbForceSnapshotCount and forceSnapshotCount.
  val ForceSnapshotCount = StateStoreCustomSumMetric("keyedstateForceSnapshotCount",
    "keyedstate commit: number of stores that took a snapshot Spark forced (lagging snapshot uploads)")
  val TtlExpiredHidden = StateStoreCustomSumMetric("ttlExpiredHidden", "keyedstate TTL: expired entries hidden from reads and scans")
  val TtlRemovedFullSnapshot = StateStoreCustomSumMetric("ttlRemovedFullSnapshot", "keyedstate TTL: expired entries removed by full-snapshot cleanup")
  val TtlRemovedIncremental = StateStoreCustomSumMetric("ttlRemovedIncremental", "keyedstate TTL: expired entries removed by incremental cleanup")
  val TtlRemovedCompaction = StateStoreCustomSumMetric("ttlRemovedCompaction", "keyedstate TTL: expired entries removed by compaction cleanup")
  val TtlRemovedBackground = StateStoreCustomSumMetric("ttlRemovedBackground", "keyedstate TTL: expired entries removed by background cleanup")

  val all: Seq[StateStoreCustomMetric] = Seq(CommitFlushMs, CommitCheckpointMs, CommitUploadMs,
    CommitManifestMs, CommitBytesUploaded, CommitFilesUploaded, CommitFilesReused,
    CommitChangelogRecords, SnapshotBytesUploaded, SnapshotsTaken, BackgroundFlushes, ForceSnapshotCount,
    LoadMs, LoadBytesDownloaded, LoadFilesReusedLocally, LoadChangelogRecordsReplayed, SstFilesBytes, TtlExpiredHidden,
    TtlRemovedFullSnapshot, TtlRemovedIncremental, TtlRemovedCompaction, TtlRemovedBackground)

  def of(
      commit: Option[CommitStats],
      load: Option[LoadStats],
      sstBytes: Long,
      ttl: TtlStats = TtlStats()): Map[StateStoreCustomMetric, Long] = {
    val c = commit.getOrElse(CommitStats())
    val l = load.getOrElse(LoadStats())
    Map(
      CommitFlushMs -> c.flushMs,
      CommitCheckpointMs -> c.checkpointMs,
      CommitUploadMs -> c.uploadMs,
      CommitManifestMs -> c.manifestMs,
      CommitBytesUploaded -> c.bytesUploaded,
      CommitFilesUploaded -> c.filesUploaded.toLong,
      CommitFilesReused -> c.filesReused.toLong,
      CommitChangelogRecords -> c.changelogRecords,
      SnapshotBytesUploaded -> c.snapshotBytesUploaded,
      SnapshotsTaken -> (if (c.snapshotTaken) 1L else 0L),
      BackgroundFlushes -> (if (c.backgroundFlush) 1L else 0L),
      ForceSnapshotCount -> (if (c.forcedSnapshot) 1L else 0L),
      LoadChangelogRecordsReplayed -> l.changelogRecordsReplayed,
      LoadMs -> l.loadMs,
      LoadBytesDownloaded -> l.bytesDownloaded,
      LoadFilesReusedLocally -> l.filesReusedLocally.toLong,
      SstFilesBytes -> sstBytes,
      TtlExpiredHidden -> ttl.expiredHidden,
      TtlRemovedFullSnapshot -> ttl.removedFullSnapshot,
      TtlRemovedIncremental -> ttl.removedIncremental,
      TtlRemovedCompaction -> ttl.removedCompaction,
      TtlRemovedBackground -> ttl.removedBackground)
  }
}
