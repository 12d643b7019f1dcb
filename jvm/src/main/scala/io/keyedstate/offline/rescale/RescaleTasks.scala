package io.keyedstate.offline.rescale

import java.io.File
import java.net.URLEncoder
import java.nio.charset.StandardCharsets.UTF_8
import java.util.UUID

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.checkpoint.{CheckpointStore, InlineEntry, LocalFileCache, LocalFiles, ManifestColumnFamily, ManifestFile, Transfers, VersionManifest}
import io.keyedstate.checkpoint.commit.SnapshotStrategy
import io.keyedstate.checkpoint.restore.{LoadStats, RestoreOperation}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.rocks.{KeyGroups, LocalRocksDB, SstWriter}
import io.keyedstate.offline.{OfflineJob, OperatorStateRedistribution, StoreRef, StoreVersions}

/** One SST file of a source partition's keys that belong to one target partition. */
final case class StagedFile(columnFamily: String, source: Int, target: Int, file: ManifestFile, keys: Long)

/** Cut one source partition's store into per-target SST files. */
final case class SplitTask(
    store: StoreRef,
    sourceDir: String,
    version: Long,
    fromPartitions: Int,
    toPartitions: Int,
    stagingDir: String)

/** `partitionLocal`: the partition's operator lists, redistributed by the driver, not staged. */
final case class SplitResult(
    store: StoreRef,
    columnFamilies: Seq[ManifestColumnFamily],
    declarationJson: Option[String],
    staged: Seq[StagedFile],
    partitionLocal: Map[String, Seq[InlineEntry]],
    keys: Long,
    bytesDownloaded: Long)

/** Assemble one target partition's store from the staged files and commit it as `version`. */
final case class BuildTask(
    store: StoreRef,
    targetDir: String,
    version: Long,
    columnFamilies: Seq[ManifestColumnFamily],
    declarationJson: Option[String],
    files: Seq[StagedFile],
    partitionLocal: Map[String, Seq[InlineEntry]],
    stagingDir: String,
    manifestDir: Option[String])

final case class BuildResult(store: StoreRef, keys: Long, bytesUploaded: Long, files: Int)

/**
 * The two executor-side steps of a rescale. Data moves in bulk: a split streams the source
 * RocksDB once, in key order, into one SST writer per target partition (the target is each
 * stored key's key-group tag, computed from the decoded key or read from its stored tag); a
 * build ingests those SST files into a fresh RocksDB and uploads it as a full snapshot, the new
 * store's first version.
 */
object RescaleTasks {
  val MaxLevel0Files = 16

  def split(task: SplitTask, hadoopSettings: Map[String, String], conf: KeyedStateConf): SplitResult =
    StoreVersions.open(task.store, task.sourceDir, task.version, hadoopSettings, conf) { (work, manifest, db, load) =>
      val staging = new CheckpointStore(new Path(task.stagingDir), OfflineJob.hadoopConf(hadoopSettings))
      val outDir = new File(work, "out")
      outDir.mkdirs()
      // Operator state is keyed by the partition that wrote it, not by a key Spark partitions: the
      // driver redistributes the lists the manifest holds inline (see RescaledOperatorState).
      val keyed = manifest.columnFamilies.filter(cf => db.hasColumnFamily(cf.name) && !KeyGroups.isPartitionLocal(cf.name))
      val staged = keyed.flatMap { cf =>
        val writers = Array.tabulate(task.toPartitions)(t => new SstWriter(new File(outDir, s"${encode(cf.name)}-$t.sst"), conf))
        try {
          var misplaced = 0L
          val it = db.scan(cf.name, None, None)
          if (KeyGroups.isBroadcast(cf.name)) {
            // Every partition holds the same broadcast state: new partition t takes old t % from's.
            val targets = OperatorStateRedistribution.broadcastTargets(task.store.partition, task.fromPartitions,
              task.toPartitions)
            try it.foreach { case (key, value) => targets.foreach(t => writers(t).put(key, value)) }
            finally it.close()
          } else {
            val tagOf = StoreVersions.tagReader(task.store, cf, task.version)
            try it.foreach { case (key, value) =>
              val tag = tagOf(key)
              if (KeyGroups.owner(tag, task.fromPartitions) != task.store.partition) misplaced += 1
              writers(KeyGroups.owner(tag, task.toPartitions)).put(key, value)
            } finally it.close()
          }
          if (misplaced > 0) {
            throw KeyedStateErrors.badState(ErrorId.RescaleRefused,
              s"$misplaced key(s) of column family '${cf.name}' in ${task.store.describe} (version ${task.version}) " +
                s"carry key-group tags that Spark's partitioning does not assign to partition ${task.store.partition} " +
                s"of ${task.fromPartitions}: the state cannot be rescaled safely")
          }
          writers.toSeq.zipWithIndex.flatMap { case (w, target) =>
            val keys = w.finish()
            if (keys == 0) None
            else {
              // A name of this attempt's own: a killed attempt of a failed run may still write
              // its file while the next run stages the same partition.
              val relative = s"${task.store.operatorId}/${encode(task.store.storeName)}/$target/" +
                s"${encode(cf.name)}/${task.store.partition}-${java.util.UUID.randomUUID()}.sst"
              val entry = staging.upload(w.file, w.file.getName, relative)
              w.file.delete()
              Some(StagedFile(cf.name, task.store.partition, target, entry, keys))
            }
          }
        } finally writers.foreach(_.close())
      }
      SplitResult(task.store, manifest.columnFamilies, manifest.declaration.map(d => compact(render(d))), staged,
        manifest.partitionLocal, staged.iterator.map(_.keys).sum, load.bytesDownloaded)
    }

  def build(task: BuildTask, hadoopSettings: Map[String, String], conf: KeyedStateConf): BuildResult =
    StoreVersions.withWorkDir(conf) { work =>
      val hadoopConf = OfflineJob.hadoopConf(hadoopSettings)
      val target = new CheckpointStore(new Path(task.targetDir), hadoopConf)
      target.ensureRoot()
      val staging = new CheckpointStore(new Path(task.stagingDir), hadoopConf)
      val db = LocalRocksDB.open(new File(work, "db"), conf)
      try {
        task.columnFamilies.foreach(cf => db.createColumnFamily(cf.name))
        val inDir = new File(work, "in")
        inDir.mkdirs()
        task.files.groupBy(_.columnFamily).foreach { case (cf, files) =>
          val local = Transfers.parallel(files, conf.transferThreads) { f =>
            val file = new File(inDir, s"${encode(cf)}-${f.source}.sst")
            staging.download(f.file, task.version, file, verifyChecksum = true)
            file
          }
          db.ingest(cf, local)
        }
        task.partitionLocal.foreach { case (cf, entries) => entries.foreach(e => db.put(cf, e.keyBytes, e.valueBytes)) }
        // Ingested files overlap (one per source partition) and land in level 0. A few are left to
        // RocksDB's own background compaction; many would stall the restarted query's first
        // writes (level0_slowdown_writes_trigger is 20), so they are compacted once here.
        if (task.files.groupBy(_.columnFamily).exists(_._2.size > RescaleTasks.MaxLevel0Files)) db.compactRange()
        val commitId = UUID.randomUUID().toString
        val snapshotDir = new File(work, "snapshot")
        snapshotDir.mkdirs()
        val snapshots = new SnapshotStrategy(target, snapshotDir, conf)
        val cp = snapshots.checkpointLocally(db, task.version, commitId)
        val uploaded = try snapshots.upload(cp, Nil) finally snapshots.discard(cp)
        val manifest = VersionManifest(VersionManifest.FormatVersion, task.version, commitId, None,
          System.currentTimeMillis(), task.columnFamilies, task.version, uploaded.files, Nil,
          declaration = task.declarationJson.map(parse(_)), partitionLocal = InlineEntry.partitionLocal(db))
        val manifestStore = task.manifestDir.fold(target)(d => new CheckpointStore(new Path(d), hadoopConf))
        manifestStore.ensureRoot()
        manifestStore.writeManifest(manifest, checkpointIdsEnabled = false)
        BuildResult(task.store, task.columnFamilies.iterator.map(_.numKeys).sum, uploaded.bytesUploaded,
          uploaded.filesUploaded)
      } finally db.close()
    }

  private def encode(name: String): String = URLEncoder.encode(name, UTF_8)
}
