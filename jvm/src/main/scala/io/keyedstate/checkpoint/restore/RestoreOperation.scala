package io.keyedstate.checkpoint.restore

import java.io.File
import java.util.UUID

import scala.util.control.NonFatal

import org.apache.spark.internal.Logging

import io.keyedstate.checkpoint.{CheckpointStore, LocalFileCache, LocalFiles, ManifestFile, Transfers, VersionManifest}
import io.keyedstate.checkpoint.commit.Changelog
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.errors.{KeyedStateErrors, LocalDiskException}

/** What one load did. */
final case class LoadStats(
    loadMs: Long = 0,
    bytesDownloaded: Long = 0,
    filesDownloaded: Int = 0,
    filesReusedLocally: Int = 0,
    changelogRecordsReplayed: Long = 0)

/**
 * Brings a version's files to local disk: files still in the local cache are linked (local
 * recovery), the rest are downloaded in parallel and checked against the manifest's size and
 * CRC32C. Any missing or damaged file fails the load, naming the file and the version; nothing
 * is papered over.
 */
final class RestoreOperation(store: CheckpointStore, cache: LocalFileCache, conf: KeyedStateConf)
    extends Logging {

  /**
   * Opens the state of `manifest` in `dbDir`: its snapshot files (cached or downloaded), then
   * its changelogs replayed in order. `what` names the store in errors.
   */
  def rebuild(manifest: VersionManifest, dbDir: File, workDir: File, what: String): (LocalRocksDB, LoadStats) = {
    val version = manifest.version
    val start = System.nanoTime()
    val snapshotFiles = materialize(manifest, dbDir)
    val db =
      try LocalRocksDB.open(dbDir, conf)
      catch {
        case e: LocalDiskException => throw e // the local disk's fault, not the snapshot's
        case NonFatal(e) => throw KeyedStateErrors.loadFailed(
          s"State version $version of $what (snapshot of version ${manifest.snapshotVersion} under " +
            s"${store.root}) could not be opened: ${e.getMessage}", e)
      }
    try {
      val replayDir = new File(workDir, s"replay-${UUID.randomUUID()}")
      val (logs, replayed) =
        try {
          val fetched = fetchInto(manifest.changelogs.map(_.file), version, replayDir)(
            _.path.replace('/', '_'))
          val records = manifest.changelogs.zip(fetched).map { case (log, (local, _)) =>
            Changelog.replay(local, db, store.resolve(log.file.path).toString, log.version)
          }.sum
          (fetched, records)
        } finally LocalFiles.deleteRecursively(replayDir)
      val fetched = snapshotFiles ++ logs
      val stats = LoadStats(
        loadMs = (System.nanoTime() - start) / 1000000,
        bytesDownloaded = fetched.iterator.flatMap(_._2).sum,
        filesDownloaded = fetched.count(_._2.isDefined),
        filesReusedLocally = fetched.count(_._2.isEmpty),
        changelogRecordsReplayed = replayed)
      (db, stats)
    } catch {
      case NonFatal(e) =>
        db.close()
        throw e
    }
  }

  /**
   * The manifest, rebased on the newest snapshot of its own history whose upload finished after
   * the manifest was written (the query stopped before a commit could name it), if any.
   */
  def latestBase(manifest: VersionManifest): VersionManifest =
    store.listSnapshotDescriptors().reverse.iterator
      .filter(ref => ref.version > manifest.snapshotVersion && ref.version <= manifest.version)
      .flatMap { ref =>
        try Some(store.readSnapshotDescriptor(ref))
        catch {
          case NonFatal(e) =>
            logWarning(s"Ignoring unreadable snapshot descriptor ${ref.path}: ${e.getMessage}")
            None
        }
      }
      .find(manifest.hasInLineage)
      .map(manifest.rebasedOn)
      .getOrElse(manifest)

  /**
   * Places each entry in `targetDir` under its RocksDB name (`name` maps it), returning the
   * local file and the bytes downloaded for it (None when the cache had it).
   */
  def fetchInto(entries: Seq[ManifestFile], version: Long, targetDir: File)(
      name: ManifestFile => String = _.localName): Seq[(File, Option[Long])] = {
    targetDir.mkdirs()
    Transfers.parallel(entries, conf.transferThreads) { entry =>
      val target = new File(targetDir, name(entry))
      if (cache.placeInto(entry, target)) target -> None
      else {
        val staged = cache.stagingFile(entry)
        try store.download(entry, version, staged, conf.verifyChecksumsOnLoad)
        catch { case e: Throwable => staged.delete(); throw e }
        LocalFileCache.place(staged, target, entry)
        cache.adopt(staged, entry)
        target -> Some(entry.size)
      }
    }
  }

  /** Rebuilds `dbDir` from the snapshot files of `manifest`; changelogs are the caller's. */
  def materialize(manifest: VersionManifest, dbDir: File): Seq[(File, Option[Long])] = {
    LocalFiles.deleteRecursively(dbDir)
    fetchInto(manifest.files, manifest.version, dbDir)()
  }
}
