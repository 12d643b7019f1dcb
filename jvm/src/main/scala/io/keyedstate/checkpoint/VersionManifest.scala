package io.keyedstate.checkpoint

import java.util.Base64

import org.json4s.{DefaultFormats, Formats, JString, JValue}
import org.json4s.jackson.Serialization

import io.keyedstate.rocks.{KeyGroups, LocalRocksDB}

/** One file a version needs: its RocksDB name, where it lives under the store directory, and
 *  its size and CRC32C, checked when it is downloaded. */
final case class ManifestFile(localName: String, path: String, size: Long, crc32c: Long)

/** The changes of one version (committed as `checkpointId`), replayed on top of a snapshot. */
final case class ChangelogFile(version: Long, checkpointId: String, records: Long, file: ManifestFile)

/**
 * A snapshot whose upload finished: written next to the manifests as
 * `<version>_<checkpoint id>.snapshot` by the background upload, so that a load can start from
 * it even when no manifest names it yet (the query stopped before its next commit).
 */
final case class SnapshotDescriptor(version: Long, checkpointId: String, files: Seq[ManifestFile])

/** A stored entry written inline in a manifest: its key and value bytes, base64. */
final case class InlineEntry(key: String, value: String) {
  def keyBytes: Array[Byte] = Base64.getDecoder.decode(key)
  def valueBytes: Array[Byte] = Base64.getDecoder.decode(value)
}

object InlineEntry {
  def apply(key: Array[Byte], value: Array[Byte]): InlineEntry =
    InlineEntry(Base64.getEncoder.encodeToString(key), Base64.getEncoder.encodeToString(value))

  /** Every entry of `db`'s partition-local column families (see `rocks.KeyGroups`), by family. */
  def partitionLocal(db: LocalRocksDB): Map[String, Seq[InlineEntry]] =
    db.columnFamilies.toSeq.filter(KeyGroups.isPartitionLocal).map { cf =>
      val it = db.scan(cf, None, None)
      cf -> (try it.map { case (k, v) => InlineEntry(k, v) }.toVector finally it.close())
    }.filter(_._2.nonEmpty).toMap
}

/** A column family in a version, with what is needed to read it without Spark's metadata. */
final case class ManifestColumnFamily(
    name: String,
    numKeys: Long,
    keySchemaJson: String,
    valueSchemaJson: String,
    keySpecJson: String,
    multipleValues: Boolean,
    internal: Boolean)

/**
 * The manifest of one committed version of one store partition. A version exists exactly when
 * its manifest exists: the manifest is written atomically after every file it lists is durable.
 *
 * The state of the version is the snapshot of `snapshotVersion` (the RocksDB files in `files`)
 * with the `changelogs` of the later versions replayed in order; a version committed as a full
 * snapshot has no changelogs.
 *
 * `checkpointId` is the unique id of this commit (Spark's checkpoint format v2 names versions by
 * it; v1 does not), `baseCheckpointId` the id of the version it was built on. `ttlCursors` holds
 * the incremental TTL cleanup's position per column family (hex of the last key checked).
 * `partitionLocal` holds, per column family keyed by the partition that wrote it (a keyed
 * function's operator state, `$op_<name>`, small by contract as Flink's), every stored entry
 * inline, base64: all partitions' operator lists are read from their manifests alone when a query
 * restores union state (`engine.UnionListRestore`), without opening any store.
 * `declaration` is what the operator that wrote the version declares about its state, kept with
 * the state so that the two cannot be lost apart (a keyed function: its key columns and each
 * state's kind and type, checked before the state is read; see `engine.OperatorDeclaration`);
 * opaque to the store, carried from version to version, absent for Spark's own operators.
 *
 * Format 3: stored values carry an 8-byte last-access stamp (see `ttl.TtlValueCodec`), and stored
 * keys carry a key-group tag only in column families whose keys cannot give it back (see
 * `rocks.KeyGroups`). Earlier formats (unstamped values, every key tagged) cannot be read by
 * this build.
 */
final case class VersionManifest(
    formatVersion: Int,
    version: Long,
    checkpointId: String,
    baseCheckpointId: Option[String],
    createdAtMs: Long,
    columnFamilies: Seq[ManifestColumnFamily],
    snapshotVersion: Long,
    files: Seq[ManifestFile],
    changelogs: Seq[ChangelogFile],
    ttlCursors: Map[String, String] = Map.empty,
    declaration: Option[JValue] = None,
    partitionLocal: Map[String, Seq[InlineEntry]] = Map.empty) {

  def sharedFiles: Seq[ManifestFile] = files.filter(f => VersionManifest.isShared(f.localName))
  /** Every durable file the version needs. */
  def allFiles: Seq[ManifestFile] = files ++ changelogs.map(_.file)

  /** Whether `d` is a snapshot of this version's own history (same commit of that version). */
  def hasInLineage(d: SnapshotDescriptor): Boolean =
    d.version > snapshotVersion && d.version <= version &&
      ((d.version == version && d.checkpointId == checkpointId) ||
        changelogs.exists(c => c.version == d.version && c.checkpointId == d.checkpointId))

  /** The same version, loaded from the later snapshot `d` of its own history. */
  def rebasedOn(d: SnapshotDescriptor): VersionManifest =
    copy(snapshotVersion = d.version, files = d.files, changelogs = changelogs.filter(_.version > d.version))
  def totalBytes: Long = allFiles.iterator.map(_.size).sum

  // What every declaration names, whatever its kind: the operator's function and uid, if any.
  def declaredFunction: Option[String] = declaredField("function")
  def declaredUid: Option[String] = declaredField("uid")
  private def declaredField(name: String): Option[String] = declaration.map(_ \ name).collect { case JString(s) => s }
}

object VersionManifest {
  val FormatVersion = 3

  private implicit val formats: Formats = DefaultFormats

  /** SST and blob files are immutable once written, so versions share them. */
  def isShared(localName: String): Boolean = localName.endsWith(".sst") || localName.endsWith(".blob")

  def toJson(m: VersionManifest): String = Serialization.writePretty(m)
  def toJson(d: SnapshotDescriptor): String = Serialization.writePretty(d)
  def descriptorFromJson(json: String): SnapshotDescriptor = Serialization.read[SnapshotDescriptor](json)

  def fromJson(json: String): VersionManifest = {
    val m = Serialization.read[VersionManifest](json)
    require(m.formatVersion == FormatVersion,
      s"unsupported manifest format version ${m.formatVersion} (this build reads $FormatVersion)")
    m
  }
}
