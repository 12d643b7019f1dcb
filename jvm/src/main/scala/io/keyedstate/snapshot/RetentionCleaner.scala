package io.keyedstate.snapshot

import java.util.concurrent.ConcurrentHashMap

import io.keyedstate.KeyedStateConf

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
  private val referencedByManifest = new ConcurrentHashMap[(String, Long), Set[String]]()

  /** @param inFlight paths of uploads whose manifest is not written yet (never deleted) */
  def cleanup(inFlight: String => Boolean = _ => false, nowMs: Long = System.currentTimeMillis()): CleanupStats = {
    val manifests = store.listManifests()
    if (manifests.isEmpty) return CleanupStats(0, 0, 0)
    val versions = manifests.map(_.version).distinct.sorted
    val oldestKept = versions(math.max(0, versions.size - conf.minVersionsToRetain))
    val (expired, kept) = manifests.partition(_.version < oldestKept)
    expired.sortBy(_.version).foreach(m => store.delete(m.path))

    val referenced = kept.iterator.flatMap(referencedFiles).toSet
    val orphanCutoff = nowMs - conf.orphanFileGracePeriodMs
    val deletable = (store.listDataFiles() ++ store.listTemporaryFiles()).filter { case (relative, status) =>
      !referenced(relative) && !inFlight(relative) && status.getModificationTime <= orphanCutoff
    }
    deletable.foreach { case (_, status) => store.delete(status.getPath) }

    val live = manifests.map(m => (m.path.getName, m.modificationTime)).toSet
    referencedByManifest.keySet().removeIf(k => !live(k))
    CleanupStats(expired.size, deletable.size, deletable.iterator.map(_._2.getLen).sum)
  }

  private def referencedFiles(ref: ManifestRef): Set[String] =
    referencedByManifest.computeIfAbsent((ref.path.getName, ref.modificationTime),
      _ => store.readManifest(ref.path, ref.version).allFiles.iterator.map(_.path).toSet)
}
