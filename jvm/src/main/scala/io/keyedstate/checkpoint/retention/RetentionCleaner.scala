package io.keyedstate.checkpoint.retention

import java.util.concurrent.ConcurrentHashMap

import io.keyedstate.checkpoint.{CheckpointStore, ManifestRef, SnapshotDescriptor}
import io.keyedstate.conf.KeyedStateConf

/** What one cleanup removed. */
final case class CleanupStats(manifestsDeleted: Int, filesDeleted: Int, bytesDeleted: Long)

/**
 * Deletes what no retained version needs. The newest `minBatchesToRetain` versions (every
 * attempt of each) are kept; older manifests are deleted oldest first, then every file under
 * shared/, private/ and changelog/ that no remaining manifest lists (and temporary manifests of
 * writers that died before their rename). That covers the files of deleted
 * versions and the orphans of failed, aborted or superseded commits. A file younger than
 * `orphanFileGracePeriodMs` is left alone, since it may belong to a commit still in flight on
 * another executor (a speculative or zombie attempt).
 */
final class RetentionCleaner(store: CheckpointStore, conf: KeyedStateConf) {
  // Manifests are immutable once written (a v1 retry replaces the file, changing its mtime).
  private val referencedByManifest = new ConcurrentHashMap[(String, Long), (Long, Set[String])]()

  /**
   * @param needed paths the loaded instance still needs although no manifest may list them:
   *               uploads whose manifest is not written yet, and the files of its own history
   *               when another attempt's manifest replaced its own (never deleted)
   */
  def cleanup(needed: String => Boolean = _ => false, nowMs: Long = System.currentTimeMillis()): CleanupStats = {
    val manifests = store.listManifests()
    if (manifests.isEmpty) return CleanupStats(0, 0, 0)
    val versions = manifests.map(_.version).distinct.sorted
    val oldestKept = versions(math.max(0, versions.size - conf.minVersionsToRetain))
    val (expired, kept) = manifests.partition(_.version < oldestKept)
    expired.sortBy(_.version).foreach(m => store.delete(m.path))

    // Snapshot descriptors newer than every retained manifest's base may still speed up a load;
    // older ones are superseded.
    val oldestBase = kept.iterator.map(referencedBase).minOption.getOrElse(0L)
    val (staleDescriptors, liveDescriptors) = store.listSnapshotDescriptors().partition(_.version < oldestBase)
    staleDescriptors.foreach(d => store.delete(d.path))
    val referenced = (kept.iterator.flatMap(referencedFiles) ++
      liveDescriptors.iterator.flatMap(descriptorFiles)).toSet
    val orphanCutoff = nowMs - conf.orphanFileGracePeriodMs
    val deletable = (store.listDataFiles() ++ store.listTemporaryFiles()).filter { case (relative, status) =>
      !referenced(relative) && !needed(relative) && status.getModificationTime <= orphanCutoff
    }
    deletable.foreach { case (_, status) => store.delete(status.getPath) }

    val live = manifests.map(m => (m.path.getName, m.modificationTime)).toSet
    referencedByManifest.keySet().removeIf(k => !live(k))
    CleanupStats(expired.size, deletable.size, deletable.iterator.map(_._2.getLen).sum)
  }

  private def referencedFiles(ref: ManifestRef): Set[String] = parsed(ref)._2

  private def referencedBase(ref: ManifestRef): Long = parsed(ref)._1

  private def parsed(ref: ManifestRef): (Long, Set[String]) =
    referencedByManifest.computeIfAbsent((ref.path.getName, ref.modificationTime), _ => {
      val m = store.readManifest(ref.path, ref.version)
      (m.snapshotVersion, m.allFiles.iterator.map(_.path).toSet)
    })

  /** An unreadable descriptor protects nothing but is not deleted either (a later load says why). */
  private def descriptorFiles(ref: ManifestRef): Set[String] =
    scala.util.Try(store.readSnapshotDescriptor(ref)).toOption.toSet.flatMap(
      (d: SnapshotDescriptor) => d.files.iterator.map(_.path).toSet)
}
