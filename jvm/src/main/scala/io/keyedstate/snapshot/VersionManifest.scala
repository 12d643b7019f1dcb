package io.keyedstate.snapshot

import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

/** One file a version needs: its RocksDB name, where it lives under the store directory, and
 *  its size and CRC32C, checked when it is downloaded. */
final case class ManifestFile(localName: String, path: String, size: Long, crc32c: Long)

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
 * `checkpointId` is the unique id of this commit (Spark's checkpoint format v2 names versions by
 * it; v1 does not), `baseCheckpointId` the id of the version it was built on.
 */
final case class VersionManifest(
    formatVersion: Int,
    version: Long,
    checkpointId: String,
    baseCheckpointId: Option[String],
    createdAtMs: Long,
    columnFamilies: Seq[ManifestColumnFamily],
    files: Seq[ManifestFile]) {

  def sharedFiles: Seq[ManifestFile] = files.filter(f => VersionManifest.isShared(f.localName))
  def totalBytes: Long = files.iterator.map(_.size).sum
}

object VersionManifest {
  val FormatVersion = 1

  private implicit val formats: Formats = DefaultFormats

  /** SST and blob files are immutable once written, so versions share them. */
  def isShared(localName: String): Boolean = localName.endsWith(".sst") || localName.endsWith(".blob")

  def toJson(m: VersionManifest): String = Serialization.writePretty(m)

  def fromJson(json: String): VersionManifest = {
    val m = Serialization.read[VersionManifest](json)
    require(m.formatVersion == FormatVersion,
      s"unsupported manifest format version ${m.formatVersion} (this build reads $FormatVersion)")
    m
  }
}
