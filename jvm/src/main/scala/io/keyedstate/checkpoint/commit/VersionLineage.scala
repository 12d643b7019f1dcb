package io.keyedstate.checkpoint.commit

import scala.concurrent.{ExecutionContext, Future}
import scala.util.{Failure, Success}

import org.apache.spark.internal.Logging
import org.json4s.JValue

import io.keyedstate.checkpoint.{ChangelogFile, CheckpointStore, InlineEntry, LocalFileCache, LocalFiles, ManifestColumnFamily, ManifestFile, SnapshotDescriptor, Transfers, VersionManifest}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB

/**
 * The durable history behind a loaded RocksDB instance, and the commit path that extends it.
 *
 * With changelog checkpointing (the default) a commit uploads only the version's changelog and
 * the manifest. Every `snapshotInterval` versions (or sooner, see `snapshotDue`) it also takes a
 * native checkpoint (hard links, synchronously: the only part that needs the task) and uploads
 * its new SST files in the background; the first commit after that upload finished bases its manifest on the new
 * snapshot, so a load replays at most about `snapshotInterval` changelogs. Without changelog
 * checkpointing every commit is a full, incremental snapshot.
 *
 * A checkpoint needs every write in SST files, and the versions since the last flush can hold
 * many batches of writes (in the heap's write buffer, see LocalRocksDB). So the commit before a
 * snapshot starts that flush without waiting for it (a background thread writes the buffer as SST
 * files while the next batch runs), and the snapshot's own flush holds one version's writes: a
 * snapshot commit's stall follows one batch, not `snapshotInterval` of them (see [[SnapshotStep]]).
 */
final class VersionLineage(
    store: CheckpointStore,
    snapshots: SnapshotStrategy,
    cache: LocalFileCache,
    conf: KeyedStateConf,
    snapshotInterval: Int,
    private var _version: Long,
    private var _checkpointId: Option[String],
    private var snapshotVersion: Long,
    private var snapshotFiles: Seq[ManifestFile],
    private var changelogs: Vector[ChangelogFile],
    snapshotUploaded: Long => Unit = _ => ()) extends Logging {

  private case class Pending(checkpoint: LocalCheckpoint, upload: Future[UploadedSnapshot])
  private var pending: Option[Pending] = None
  // Writes of versions up to this one are flushed or being flushed. The loader starts flushing
  // what it replayed, so a loaded version counts as flushed: its first commit can snapshot at once.
  private var flushedThrough: Long = _version

  def version: Long = _version
  def checkpointId: Option[String] = _checkpointId

  /** Paths an unfinished background upload may write: cleanup must leave them alone. */
  def inFlight(path: String): Boolean =
    pending.exists(p => SnapshotStrategy.belongsTo(path, p.checkpoint.snapshotId))

  /**
   * What cleanup must leave alone: the files this lineage's next manifest will list, and those
   * of an unfinished background upload. The last manifest written normally lists the former too,
   * but with format v1 another attempt at the same version (speculative, retried or zombie) may
   * have replaced it while this instance lives on to commit the next version. Called under the
   * provider's files lock, which every commit holds while it changes the lineage.
   */
  def neededFiles: String => Boolean = {
    val listed = (snapshotFiles.iterator ++ changelogs.iterator.map(_.file)).map(_.path).toSet
    path => listed(path) || inFlight(path)
  }

  def commit(
      db: LocalRocksDB,
      changelog: Option[Changelog.Writer],
      columnFamilies: Seq[ManifestColumnFamily],
      stateKeys: Long,
      newVersion: Long,
      commitId: String,
      forceSnapshot: Boolean,
      ttlCursors: Map[String, String] = Map.empty,
      declaration: Option[JValue] = None): (VersionManifest, CommitStats) = {
    var stats = CommitStats()

    // 1. This version's changes.
    val logged =
      try changelog.filter(_ => conf.changelogCheckpointing).filter(_.numRecords > 0).map { w =>
        w.finish()
        var entry: ManifestFile = null
        val ms = LocalFiles.timed { entry = snapshots.uploadChangelog(w.file, newVersion, commitId) }
        cache.adopt(w.file, entry)
        stats = stats.copy(uploadMs = ms, bytesUploaded = entry.size, filesUploaded = 1,
          changelogRecords = w.numRecords)
        ChangelogFile(newVersion, commitId, w.numRecords, entry)
      }
      finally changelog.foreach(_.close()) // deletes the local log unless it was adopted above

    // 2. A background snapshot that finished becomes the base.
    stats = promoteFinishedSnapshot(stats)

    // 3. Snapshot now?
    if (!conf.changelogCheckpointing) {
      val cp = snapshots.checkpointLocally(db, newVersion, commitId)
      try {
        val up = snapshots.upload(cp, snapshotFiles)
        up.local.foreach { case (f, e) => cache.adopt(f, e) }
        rebase(newVersion, up.files)
        snapshotUploaded(newVersion)
        stats = stats.copy(flushMs = cp.flushMs, checkpointMs = cp.checkpointMs, uploadMs = up.uploadMs,
          bytesUploaded = up.bytesUploaded, filesUploaded = up.filesUploaded, filesReused = up.filesReused,
          snapshotTaken = true)
      } finally snapshots.discard(cp)
    } else {
      val step = nextStep(newVersion, stateKeys, forceSnapshot, logged.map(_.records).getOrElse(0L))
      changelogs = changelogs ++ logged
      if (step == SnapshotStep.Prime) {
        // A flush RocksDB refused (writes stopped) leaves the snapshot's own flush to do it all.
        if (db.flushInBackground()) flushedThrough = newVersion
        stats = stats.copy(backgroundFlush = true)
      } else if (step == SnapshotStep.Take) {
        val cp = snapshots.checkpointLocally(db, newVersion, commitId)
        flushedThrough = newVersion
        val base = snapshotFiles
        logInfo(s"Snapshot of ${store.root} version $newVersion taken (flush ${cp.flushMs} ms, checkpoint " +
          s"${cp.checkpointMs} ms); uploading in the background")
        val upload = Future {
          val up = snapshots.upload(cp, base)
          // Durable on its own: a load can start from it even if no manifest ever names it.
          store.writeSnapshotDescriptor(SnapshotDescriptor(up.version, cp.snapshotId, up.files))
          logInfo(s"Snapshot of ${store.root} version ${up.version} uploaded: ${up.filesUploaded} files " +
            s"(${up.bytesUploaded} bytes) in ${up.uploadMs} ms, ${up.filesReused} reused")
          snapshotUploaded(up.version)
          // Local recovery can start from it too (the commit that promotes it finds them cached).
          up.local.foreach { case (f, e) => cache.adopt(f, e) }
          up
        }(VersionLineage.uploads(conf))
        pending = Some(Pending(cp, upload))
        stats = stats.copy(flushMs = cp.flushMs, checkpointMs = cp.checkpointMs, snapshotTaken = true)
      }
    }

    // 4. The manifest makes the version exist.
    val manifest = VersionManifest(VersionManifest.FormatVersion, newVersion, commitId, _checkpointId,
      System.currentTimeMillis(), columnFamilies, snapshotVersion, snapshotFiles, changelogs, ttlCursors,
      declaration, InlineEntry.partitionLocal(db))
    val manifestMs = LocalFiles.timed(store.writeManifest(manifest, conf.checkpointIdsEnabled))
    cache.retainOnly(manifest.allFiles, alsoKeep = inFlight)
    _version = newVersion
    _checkpointId = Some(commitId)
    (manifest, stats.copy(manifestMs = manifestMs))
  }

  /**
   * Whether a commit of `newVersion` now would take a snapshot (TTL's full-snapshot and
   * compaction cleanup run in exactly those commits). A finished background upload counts as
   * done: the commit promotes it before deciding.
   */
  def snapshotPlanned(newVersion: Long, stateKeys: Long, forceSnapshot: Boolean): Boolean =
    !conf.changelogCheckpointing || nextStep(newVersion, stateKeys, forceSnapshot, 0L) == SnapshotStep.Take

  /**
   * What the commit of `newVersion` does towards a snapshot, given `records` changelog records of
   * its own. A due snapshot is taken at once when the flush it needs holds only this version's
   * writes (or when Spark forces it); otherwise this commit starts the flush and the next one
   * takes the snapshot. A commit also starts the flush when the snapshot falls due at the next
   * version, so the usual snapshot commit flushes one batch.
   */
  private def nextStep(newVersion: Long, stateKeys: Long, force: Boolean, records: Long): SnapshotStep = {
    val uploading = pending.exists(!_.upload.isCompleted)
    // The base once the pending upload, if any, is promoted: its version unless it failed.
    val base = pending match {
      case Some(p) if p.upload.value.forall(_.isSuccess) => p.checkpoint.version
      case _ => snapshotVersion
    }
    val earlierUnflushed = changelogs.exists(c => c.version > flushedThrough && c.version < newVersion)
    if (!uploading && (force || snapshotDue(newVersion, stateKeys, base, records))) {
      if (earlierUnflushed && !force) SnapshotStep.Prime else SnapshotStep.Take
    } else if ((earlierUnflushed || records > 0) && newVersion + 1 - base >= snapshotInterval) SnapshotStep.Prime
    else SnapshotStep.Skip
  }

  /**
   * Every `snapshotInterval` versions, and sooner when replaying the chain would cost more than
   * loading the whole state (more changelog records than keys, e.g. after a bulk load).
   */
  private def snapshotDue(version: Long, stateKeys: Long, base: Long, records: Long): Boolean =
    version - base >= snapshotInterval ||
      changelogs.iterator.filter(_.version > base).map(_.records).sum + records >=
        math.max(stateKeys, VersionLineage.MinRecordsForEarlySnapshot)

  private def promoteFinishedSnapshot(stats: CommitStats): CommitStats = pending match {
    case Some(Pending(cp, upload)) if upload.isCompleted =>
      pending = None
      try upload.value.get match {
        case Success(up) =>
          rebase(up.version, up.files)
          stats.copy(snapshotBytesUploaded = up.bytesUploaded)
        case Failure(e) =>
          logWarning(s"Background snapshot of ${store.root} version ${cp.version} failed; the next one retries", e)
          stats
      } finally snapshots.discard(cp)
    case _ => stats
  }

  private def rebase(version: Long, files: Seq[ManifestFile]): Unit = {
    snapshotVersion = version
    snapshotFiles = files
    changelogs = changelogs.filter(_.version > version)
  }

  /** Tests only: waits for a background snapshot upload, if one runs. */
  def awaitPendingSnapshot(): Unit =
    pending.foreach(p => scala.concurrent.Await.ready(p.upload, scala.concurrent.duration.Duration.Inf))

  /**
   * The instance is being dropped. A running upload finishes alone (its descriptor still lets a
   * later load start from it); the returned future completes when it has.
   */
  def close(): Future[Unit] = pending match {
    case Some(p) =>
      pending = None
      p.upload.transform(_ => Success(snapshots.discard(p.checkpoint)))(VersionLineage.uploads(conf))
    case None => Future.unit
  }
}

object VersionLineage {
  /** Below this many changelog records a chain is cheap to replay whatever the state size. */
  val MinRecordsForEarlySnapshot = 100000L

  @volatile private var pool: ExecutionContext = _

  /** Background snapshot uploads, one pool per executor JVM (file transfers use their own). */
  private def uploads(conf: KeyedStateConf): ExecutionContext = synchronized {
    if (pool == null) pool = Transfers.daemonPool("keyedstate-snapshot", math.max(1, conf.transferThreads / 2))
    pool
  }
}

/** What one commit does towards a snapshot (changelog checkpointing). */
private sealed trait SnapshotStep
private object SnapshotStep {
  /** Nothing: the snapshot is not due, nor due at the next version. */
  case object Skip extends SnapshotStep
  /** Start flushing in the background (the write buffer, the memtables), for a snapshot at the next commit. */
  case object Prime extends SnapshotStep
  /** Flush what is left and take the native checkpoint now; upload it in the background. */
  case object Take extends SnapshotStep
}
