package io.keyedstate

import java.io.File
import java.util.UUID

import scala.util.control.NonFatal

import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, StateStore, StateStoreConf, StateStoreId}
import org.apache.spark.sql.types.StructType
import org.json4s.JValue

import io.keyedstate.checkpoint.{BootstrappedState, ChangelogFile, CheckpointStore, LocalFileCache, LocalFiles, ManifestColumnFamily, ManifestFile, VersionManifest}
import io.keyedstate.checkpoint.commit.{Changelog, SnapshotStrategy, VersionLineage}
import io.keyedstate.checkpoint.restore.{LoadStats, RestoreOperation}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.LocalRocksDB
import io.keyedstate.errors.KeyedStateErrors

/** The schema of a provider's default column family, as Spark declared it in `init`. */
private[keyedstate] final case class StoreSchema(
    keySchema: StructType,
    valueSchema: StructType,
    keySpec: KeyStateEncoderSpec,
    useColumnFamilies: Boolean,
    multipleValuesPerKey: Boolean)

/** A loaded version: the working instance and the durable history its commits extend. */
private[keyedstate] final case class LoadedVersion(instance: StoreInstance, lineage: VersionLineage)

/**
 * The load path of one store partition: an empty state, or a committed version rebuilt from its
 * manifest (snapshot files from the local cache or the checkpoint, then its changelogs replayed),
 * as a working [[StoreInstance]] in `dbDir` with its [[VersionLineage]].
 */
private[keyedstate] final class StoreLoader(
    id: StateStoreId,
    schema: StoreSchema,
    conf: KeyedStateConf,
    storeConf: StateStoreConf,
    checkpointStore: CheckpointStore,
    cache: LocalFileCache,
    snapshots: SnapshotStrategy,
    restores: RestoreOperation,
    dbDir: File,
    workDir: File,
    onSnapshotUploaded: Long => Unit) extends Logging {

  /** The empty state at `version` (version 0, or `loadEmpty`). */
  def empty(version: Long): LoadedVersion = {
    logInfo(s"Starting $id at version $version with no state")
    LocalFiles.deleteRecursively(dbDir)
    loaded(LocalRocksDB.open(dbDir, conf), Nil, Map.empty, None,
      lineage(version, None, snapshotVersion = version, Nil, Vector.empty))
  }

  /**
   * Whether version 0 holds state: a bootstrapped checkpoint's ([[BootstrappedState]]), which a
   * query's first batch starts from. Otherwise version 0 is the empty state before the first batch.
   */
  def bootstrapped: Boolean = BootstrappedState.adopt(checkpointStore, id)

  /** The committed state of `version` (of the commit `checkpointId` names, under format v2). */
  def restore(version: Long, checkpointId: Option[String]): (LoadedVersion, LoadStats) = {
    val manifest = restores.latestBase(resolveManifest(version, checkpointId))
    val (db, stats) = restores.rebuild(manifest, dbDir, workDir, id.toString)
    val result = try {
      // The replayed changelogs sit in the write buffer: flush them while the first batch runs, so
      // the version's lineage starts flushed (see VersionLineage).
      if (stats.changelogRecordsReplayed > 0) db.flushInBackground()
      cache.retainOnly(manifest.allFiles)
      loaded(db, manifest.columnFamilies, manifest.ttlCursors, manifest.declaration, lineage(manifest.version,
        Some(manifest.checkpointId), manifest.snapshotVersion, manifest.files, manifest.changelogs.toVector))
    } catch {
      case NonFatal(e) =>
        db.close()
        throw e
    }
    logInfo(s"Loaded $id version ${manifest.version}: $stats")
    (result, stats)
  }

  private def lineage(
      version: Long,
      checkpointId: Option[String],
      snapshotVersion: Long,
      files: Seq[ManifestFile],
      changelogs: Vector[ChangelogFile]): VersionLineage =
    new VersionLineage(checkpointStore, snapshots, cache, conf, storeConf.minDeltasForSnapshot,
      version, checkpointId, snapshotVersion, files, changelogs, onSnapshotUploaded)

  private def loaded(
      db: LocalRocksDB,
      columnFamilies: Seq[ManifestColumnFamily],
      ttlCursors: Map[String, String],
      declaration: Option[JValue],
      history: VersionLineage): LoadedVersion = {
    val changelogs =
      if (conf.changelogCheckpointing) {
        val codec = Changelog.Compression.named(conf.changelogCompression)
        Some(() => new Changelog.Writer(new File(workDir, s"changelog-${UUID.randomUUID()}.log"), codec))
      } else None
    val inst = new StoreInstance(db, id.storeName, conf, schema.useColumnFamilies, columnFamilies, changelogs,
      cf => conf.ttl.forColumnFamily(id.operatorId, cf), ttlCursors, declaration)
    inst.registerCodec(StateStore.DEFAULT_COL_FAMILY_NAME, schema.keySchema, schema.valueSchema, schema.keySpec,
      schema.multipleValuesPerKey, isInternal = false)
    LoadedVersion(inst, history)
  }

  /** The manifest of `version`: by checkpoint id (format v2) or by version alone (v1). */
  private def resolveManifest(version: Long, checkpointId: Option[String]): VersionManifest =
    checkpointId match {
      case Some(_) => checkpointStore.readManifest(version, checkpointId)
      case None if !conf.checkpointIdsEnabled => checkpointStore.readManifest(version, None)
      case None =>
        checkpointStore.listManifests().filter(_.version == version) match {
          case Seq(only) => checkpointStore.readManifest(only.path, version)
          case Seq() => checkpointStore.readManifest(version, None)
          case several => throw KeyedStateErrors.loadFailed(
            s"State version $version of $id has ${several.size} commits " +
              s"(${several.map(_.path.getName).mkString(", ")}) and no checkpoint id was given")
        }
    }
}
