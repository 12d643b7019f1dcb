package io.keyedstate.offline

import java.io.File
import java.util.UUID

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path

import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.checkpoint.{CheckpointStore, LocalFileCache, LocalFiles, ManifestColumnFamily, VersionManifest}
import io.keyedstate.checkpoint.restore.{LoadStats, RestoreOperation}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.rocks.{KeyGroups, LocalRocksDB}

/**
 * The offline reader of one store partition's committed version, beside the provider: the
 * version rebuilt as a local RocksDB (its base snapshot and changelogs) in a scratch directory
 * that is dropped afterwards. Rescale splits it, inspect scans it.
 */
object StoreVersions {
  def open[T](
      store: StoreRef,
      storeDir: String,
      version: Long,
      hadoopSettings: Map[String, String],
      conf: KeyedStateConf,
      checkpointId: Option[String] = None)(f: (File, VersionManifest, LocalRocksDB, LoadStats) => T): T =
    withWorkDir(conf) { work =>
      val source = new CheckpointStore(new Path(storeDir), OfflineJob.hadoopConf(hadoopSettings))
      val restores = new RestoreOperation(source, LocalFileCache.forStore(new File(work, "cache"), storeDir), conf)
      val manifest = restores.latestBase(source.readManifest(version, checkpointId))
      val (db, load) = restores.rebuild(manifest, new File(work, "db"), work, store.describe)
      try f(work, manifest, db, load) finally db.close()
    }

  /** A scratch directory under the provider's local base directory, dropped after `f`. */
  def withWorkDir[T](conf: KeyedStateConf)(f: File => T): T = {
    val dir = new File(KeyedStateStoreProvider.localBaseDir(conf), s"offline-${UUID.randomUUID()}")
    dir.mkdirs()
    try f(dir) finally LocalFiles.deleteRecursively(dir)
  }

  /** How the stored keys of `cf` give their key-group tags (see [[KeyGroups]]). */
  def tagReader(store: StoreRef, cf: ManifestColumnFamily, version: Long): Array[Byte] => Int = {
    if (cf.keySchemaJson.isEmpty || cf.keySpecJson.isEmpty) {
      throw KeyedStateErrors.badState(ErrorId.RescaleRefused, s"column family '${cf.name}' of " +
        s"${store.describe} (version $version) records no key schema: its keys' key groups are unknown")
    }
    val tagOf = KeyGroups.tagReader(store.storeName, cf.keySchemaJson, cf.keySpecJson)
    key => try tagOf(key) catch {
      case NonFatal(e) => throw KeyedStateErrors.badState(ErrorId.RescaleRefused, s"a key of ${key.length} " +
        s"bytes in column family '${cf.name}' of ${store.describe} (version $version) does not decode with its " +
        s"recorded key schema and encoding (${e.getClass.getSimpleName}: ${e.getMessage})")
    }
  }
}
