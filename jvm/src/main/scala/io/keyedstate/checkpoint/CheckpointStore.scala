package io.keyedstate.checkpoint

import java.io.{BufferedOutputStream, File, FileInputStream, InputStream, IOException, OutputStream}
import java.nio.charset.StandardCharsets.UTF_8
import java.util.zip.CRC32C

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{CommonPathCapabilities, FileStatus, FileSystem, LocalFileSystem, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.permission.FsPermission
import org.apache.spark.internal.Logging

import io.keyedstate.errors.{CheckpointFileException, KeyedStateErrors, LocalDiskException}
import io.keyedstate.shims.SparkTypes.{CheckpointFileManager, FileContextBasedCheckpointFileManager}

/** A manifest (or snapshot descriptor) found in the store directory. */
final case class ManifestRef(version: Long, checkpointId: Option[String], path: Path, modificationTime: Long)

/**
 * The durable side of one store partition, under Spark's `storeCheckpointLocation()`
 * (`<checkpoint>/state/<operator>/<partition>[/<store>]`), through Hadoop's FileSystem API:
 * {{{
 *   shared/<sst name>-<commit id>.sst    immutable files, shared by every version that lists them
 *   private/<version>-<commit id>-<name> RocksDB's small per-checkpoint files (MANIFEST, OPTIONS, CURRENT)
 *   changelog/<version>-<commit id>.changelog  one version's changes (changelog checkpointing)
 *   <version>.manifest                   checkpoint format v1: the version's manifest
 *   <version>_<commit id>.manifest       checkpoint format v2: one per commit id
 * }}}
 */
final class CheckpointStore(val root: Path, val hadoopConf: Configuration) extends Logging {
  import CheckpointStore._

  // On the local file system, skip Hadoop's checksummed wrapper: its .crc side files double
  // every write, and every file here carries its own CRC32C in the manifest already.
  private val fs: FileSystem = root.getFileSystem(hadoopConf) match {
    case local: LocalFileSystem => local.getRawFileSystem
    case other => other
  }
  // The java.nio shortcuts only for Hadoop's own local file system: a subclass (a test file
  // system, a wrapper) has its own create and rename, and its writes must go through them.
  private val isLocal = fs.getClass == classOf[RawLocalFileSystem]

  /**
   * A new file to write. On the local file system through java.nio: without Hadoop's native
   * library (absent from a pip-installed PySpark), Hadoop's local create sets the permissions by
   * starting a `chmod` process for every file, a few milliseconds in each commit's path.
   */
  private def create(path: Path, overwrite: Boolean): OutputStream =
    if (isLocal) {
      import java.nio.file.StandardOpenOption._
      val file = new File(path.toUri.getPath).toPath
      java.nio.file.Files.createDirectories(file.getParent)
      // Overwriting replaces the name, never truncates its file: that may be a savepoint's hard link.
      if (overwrite) java.nio.file.Files.deleteIfExists(file)
      val out = java.nio.file.Files.newOutputStream(file, CREATE_NEW, WRITE)
      // The mode Hadoop gives a new local file (`fs.permissions.umask-mode`), not the process umask.
      try java.nio.file.Files.setPosixFilePermissions(file, filePermissions)
      catch { case NonFatal(e) => out.close(); throw e }
      new BufferedOutputStream(out, 1 << 16)
    } else fs.create(path, overwrite)
  private lazy val filePermissions = java.nio.file.attribute.PosixFilePermissions.fromString(
    FsPermission.getFileDefault.applyUMask(FsPermission.getUMask(hadoopConf)).toString)
  private lazy val fileManager = CheckpointFileManager.create(root, hadoopConf)
  // Object stores (s3a) have no atomic rename: replacing a manifest by a rename deletes the old
  // one first, and an attempt stopped between that delete and the copy leaves the version with
  // no manifest at all. Where output streams can be aborted, a written object replaces the old
  // one whole when the stream closes and an aborted stream publishes nothing: write in place.
  private lazy val writesInPlace: Boolean =
    try fs.hasPathCapability(root, CommonPathCapabilities.ABORTABLE_STREAM)
    catch { case NonFatal(_) => false }

  def manifestPath(version: Long, checkpointId: Option[String]): Path =
    new Path(root, manifestName(version, checkpointId))

  def resolve(relative: String): Path = new Path(root, relative)

  def hasManifest(version: Long, checkpointId: Option[String]): Boolean = fs.exists(manifestPath(version, checkpointId))

  /** Makes the partition directory exist: Spark's state reader discovers partitions by listing. */
  def ensureRoot(): Unit =
    if (!fs.exists(root) && !fs.mkdirs(root) && !fs.exists(root)) {
      throw KeyedStateErrors.checkpointWrite(s"Cannot create the state directory $root: the file system refused")
    }

  def listManifests(): Seq[ManifestRef] = listNamed(ManifestSuffix)

  def listSnapshotDescriptors(): Seq[ManifestRef] = listNamed(SnapshotSuffix).filter(_.checkpointId.isDefined)

  private def listNamed(suffix: String): Seq[ManifestRef] = listOrEmpty(root).flatMap { st =>
    parseName(st.getPath.getName, suffix).map { case (v, id) =>
      ManifestRef(v, id, st.getPath, st.getModificationTime)
    }
  }.sortBy(r => (r.version, r.modificationTime))

  def writeSnapshotDescriptor(d: SnapshotDescriptor): Unit = {
    val path = new Path(root, s"${d.version}_${d.checkpointId}$SnapshotSuffix")
    val bytes = VersionManifest.toJson(d).getBytes(UTF_8)
    writeManifestFile(path, bytes, d.version)
  }

  def readSnapshotDescriptor(ref: ManifestRef): SnapshotDescriptor = {
    val in = fs.open(ref.path)
    val d = try VersionManifest.descriptorFromJson(new String(in.readAllBytes(), UTF_8)) finally in.close()
    require(d.version == ref.version, s"${ref.path} describes version ${d.version}")
    d
  }

  /** Files under shared/, private/ and changelog/, as paths relative to the root. */
  def listDataFiles(): Seq[(String, FileStatus)] =
    Seq(SharedDir, PrivateDir, ChangelogDir).flatMap { d =>
      listOrEmpty(new Path(root, d))
        // Hidden files are temporary or the file system's own (e.g. Hadoop's .crc side files).
        .filterNot(st => st.getPath.getName.startsWith("."))
        .map(st => (s"$d/${st.getPath.getName}", st))
    }

  /** Temporary manifests left by a writer that died before its rename, as (relative path, status). */
  def listTemporaryFiles(): Seq[(String, FileStatus)] =
    listOrEmpty(root).filter { st =>
      val name = st.getPath.getName
      st.isFile && name.startsWith(".") && name.endsWith(".tmp")
    }.map(st => (st.getPath.getName, st))

  private def listOrEmpty(dir: Path): Seq[FileStatus] =
    try fs.listStatus(dir).toSeq
    catch { case _: java.io.FileNotFoundException => Seq.empty }

  def readManifest(version: Long, checkpointId: Option[String]): VersionManifest =
    readManifest(manifestPath(version, checkpointId), version)

  def readManifest(path: Path, version: Long): VersionManifest = {
    val json = CheckpointStore.readText(fs, path) { e =>
      KeyedStateErrors.fileMissing(s"State version $version is missing: manifest $path does not exist", e, file = path)
    }
    val manifest =
      try VersionManifest.fromJson(json)
      catch {
        case NonFatal(e) =>
          throw KeyedStateErrors.fileCorrupt(
            s"State version $version has a corrupt manifest $path (${json.length} bytes): ${e.getMessage}", e)
      }
    if (manifest.version != version) {
      throw KeyedStateErrors.fileCorrupt(
        s"State manifest $path describes version ${manifest.version}, expected version $version")
    }
    manifest
  }

  /** Atomic: readers see the whole manifest or none. With v1, a retried attempt replaces it. */
  def writeManifest(m: VersionManifest, checkpointIdsEnabled: Boolean): Unit = {
    val path = manifestPath(m.version, if (checkpointIdsEnabled) Some(m.checkpointId) else None)
    val bytes = VersionManifest.toJson(m).getBytes(UTF_8)
    writeManifestFile(path, bytes, m.version)
  }

  /** A manifest or descriptor appears whole or not at all, and replaces an earlier one whole. */
  private def writeManifestFile(path: Path, bytes: Array[Byte], version: Long): Unit =
    if (isLocal) writeLocalAtomically(path, bytes, version)
    else if (writesInPlace) writeInPlace(path, bytes, version)
    else writeAtomically(path, bytes, version)

  /** A temporary file renamed over the target: POSIX rename is atomic and replaces. */
  private def writeLocalAtomically(path: Path, bytes: Array[Byte], version: Long): Unit = {
    val tmp = new Path(root, s".${path.getName}.${java.util.UUID.randomUUID()}.tmp")
    try {
      val out = create(tmp, overwrite = true)
      try out.write(bytes) finally out.close()
      val target = new java.io.File(path.toUri.getPath).toPath
      java.nio.file.Files.move(new java.io.File(tmp.toUri.getPath).toPath, target,
        java.nio.file.StandardCopyOption.ATOMIC_MOVE, java.nio.file.StandardCopyOption.REPLACE_EXISTING)
    } catch {
      case NonFatal(e) =>
        delete(tmp)
        throw manifestWriteFailed(path, version, e)
    }
  }

  /** On an object store with abortable streams: the object is published by `close` only. */
  private def writeInPlace(path: Path, bytes: Array[Byte], version: Long): Unit = {
    val out = creatingManifest(path, version)(fs.create(path, true))
    writeAndClose(out, path, bytes, version) { e =>
      try out.abort() catch { case NonFatal(abortFailure) => e.addSuppressed(abortFailure) }
    }
  }

  /**
   * Writes a manifest's `bytes` to its stream and closes it, which publishes it; a failure
   * `discard`s the stream (the failure at hand, to add its own to) and names the manifest.
   */
  private def writeAndClose(out: OutputStream, path: Path, bytes: Array[Byte], version: Long)(
      discard: Throwable => Unit): Unit =
    try {
      out.write(bytes)
      out.close()
    } catch {
      case NonFatal(e) =>
        discard(e)
        throw manifestWriteFailed(path, version, e)
    }

  /**
   * Opens a manifest's stream; a failure names the manifest and the version like a failed write.
   * Creating one already talks to the store (S3A lists the key's parent), and an object store's
   * client may fail with an unchecked exception (the AWS SDK's `UncheckedIOException` when the
   * endpoint drops a response half-way).
   */
  private def creatingManifest[T](path: Path, version: Long)(create: => T): T =
    try create catch {
      case NonFatal(e) =>
        throw manifestWriteFailed(path, version, e)
    }

  private def manifestWriteFailed(path: Path, version: Long, e: Throwable): Exception =
    KeyedStateErrors.checkpointWrite(s"Cannot write state manifest $path for version $version: ${reason(e)}", e)

  /**
   * An object store's endpoint, which a failure's message may not name (a connection the
   * endpoint closed says only that): the error names what could not be reached.
   */
  private lazy val endpoint: Option[String] =
    if (root.toUri.getScheme != "s3a") None
    else Option(hadoopConf.get(s"fs.s3a.bucket.${root.toUri.getHost}.endpoint"))
      .orElse(Option(hadoopConf.get("fs.s3a.endpoint"))).filter(_.nonEmpty)

  private def reason(e: Throwable): String = {
    val message = String.valueOf(e.getMessage)
    endpoint.filterNot(message.contains).fold(message)(at => s"$message (endpoint $at)")
  }

  /** Spark's CheckpointFileManager picks the atomic write each file system supports. */
  private def writeAtomically(path: Path, bytes: Array[Byte], version: Long): Unit = {
    val out = creatingManifest(path, version)(fileManager.createAtomic(path, true))
    writeAndClose(out, path, bytes, version)(_ => out.cancel())
    if (!renameReportsFailure) checkPublished(path, bytes, version)
  }

  // Spark's FileContext-based manager renames with OVERWRITE and throws on failure. Its fallback
  // for file systems without a FileContext binding takes a rename that returned false over an
  // existing target for success (a v1 retry's manifest would silently not replace the old one).
  private lazy val renameReportsFailure = fileManager.isInstanceOf[FileContextBasedCheckpointFileManager]

  /** The manifest now at `path` is the one just written, or the write failed. */
  private def checkPublished(path: Path, bytes: Array[Byte], version: Long): Unit = {
    val published =
      try { val in = fs.open(path); try in.readAllBytes() finally in.close() }
      catch {
        case NonFatal(e) =>
          throw KeyedStateErrors.checkpointWrite(s"Cannot write state manifest $path for version $version: it cannot be read back", e)
      }
    if (!java.util.Arrays.equals(published, bytes)) {
      throw KeyedStateErrors.checkpointWrite(
        s"Cannot write state manifest $path for version $version: the file system did not replace the existing " +
          "manifest (its rename reported failure)")
    }
  }

  /** Uploads a local file to `relative` (a fresh, unique name) and returns its manifest entry. */
  def upload(local: File, localName: String, relative: String): ManifestFile = {
    val target = resolve(relative)
    val crc = new CRC32C()
    val in = new FileInputStream(local)
    val size =
      try {
        val out = create(target, overwrite = false)
        try copy(in, out, crc) finally out.close()
      } catch {
        case NonFatal(e) => throw KeyedStateErrors.checkpointWrite(s"Cannot upload $local to $target: ${reason(e)}", e)
      } finally in.close()
    // The bytes actually written, not the local file's length afterwards.
    ManifestFile(localName, relative, size, crc.getValue)
  }

  /** A file `version` needs, opened; a missing one is an error naming it and the version. */
  private def openNeeded(source: Path, version: Long): InputStream =
    try fs.open(source)
    catch {
      case e: java.io.FileNotFoundException =>
        throw KeyedStateErrors.fileMissing(s"State file $source needed by version $version is missing", e, file = source)
    }

  /**
   * Downloads `file` of `version` to `target`, verifying size and (optionally) CRC32C. A missing
   * or damaged file is an error that names the file and the version.
   */
  def download(file: ManifestFile, version: Long, target: File, verifyChecksum: Boolean): Long = {
    val source = resolve(file.path)
    val crc = new CRC32C()
    val in = openNeeded(source, version)
    val copied =
      try {
        val out = new LocalFileOutput(target, s"state file $source (needed by version $version) to")
        try copy(in, out, crc) finally out.close()
      } catch {
        case e: LocalDiskException => throw e // the local disk's fault, not the file's
        case e: IOException => throw KeyedStateErrors.fileCorrupt(
          s"State file $source needed by version $version is corrupt or unreadable: ${e.getMessage}", e)
      } finally in.close()
    if (copied != file.size) {
      throw KeyedStateErrors.fileSizeMismatch(
        s"State file $source needed by version $version is damaged: " +
          s"$copied bytes, the manifest says ${file.size}", source, target, file.size, copied)
    }
    if (verifyChecksum && crc.getValue != file.crc32c) {
      throw KeyedStateErrors.fileCorrupt(
        s"State file $source needed by version $version is corrupt: " +
          f"CRC32C ${crc.getValue}%08x, the manifest says ${file.crc32c}%08x")
    }
    copied
  }

  /**
   * `file` of `version` at the same relative path under `target`: a hard link when both are on
   * the local file system (a store never writes a file in place, it creates files under new
   * names and deletes them, so the two names keep the same bytes), else, or when the link fails
   * (another device), a copy ([[copyTo]]). A link's size is checked against the manifest, and
   * its CRC32C when `verify` (a restore: a savepoint's files are checked when they are used).
   */
  def linkOrCopyTo(file: ManifestFile, version: Long, target: CheckpointStore, verify: Boolean): Unit =
    if (!(isLocal && target.isLocal) || !link(file, version, target, verify)) copyTo(file, version, target)

  private def link(file: ManifestFile, version: Long, target: CheckpointStore, verify: Boolean): Boolean = {
    import java.nio.file.Files
    val source = resolve(file.path)
    val linked = new File(target.resolve(file.path).toUri.getPath).toPath
    try {
      Files.createDirectories(linked.getParent)
      Files.deleteIfExists(linked)
      Files.createLink(linked, new File(source.toUri.getPath).toPath)
    } catch {
      case _: IOException | _: UnsupportedOperationException => return false // missing: the copy names it
    }
    val crc = if (!verify) None else {
      val c = new CRC32C()
      val in = openNeeded(source, version)
      try copy(in, OutputStream.nullOutputStream(), c) finally in.close()
      Some(c.getValue)
    }
    requireIntact(source, version, file, Files.size(linked), crc)
    true
  }

  /** A copied or linked file's size and, when read, CRC32C against the manifest's. */
  private def requireIntact(source: Path, version: Long, file: ManifestFile, size: Long, crc: Option[Long]): Unit =
    if (size != file.size || crc.exists(_ != file.crc32c)) {
      throw KeyedStateErrors.fileCorrupt(s"State file $source needed by version $version is damaged: $size bytes" +
        crc.fold("")(c => f", CRC32C $c%08x") + s"; the manifest says ${file.size} bytes" +
        crc.fold("")(_ => f", ${file.crc32c}%08x"))
    }

  /**
   * Copies `file` of `version` to the same relative path under `target` (another store, on any
   * file system), verifying its size and CRC32C on the way: a missing or damaged source names the
   * file and the version; a failed write names the target.
   */
  def copyTo(file: ManifestFile, version: Long, target: CheckpointStore): Unit = {
    val source = resolve(file.path)
    val crc = new CRC32C()
    val in = openNeeded(source, version)
    val written = target.resolve(file.path)
    def writeFailed(e: Throwable) = KeyedStateErrors.checkpointWrite(s"Cannot write $written: ${e.getMessage}", e)
    val copied =
      try {
        val created =
          try target.create(written, overwrite = true)
          catch { case NonFatal(e) => throw writeFailed(e) }
        // The target's failures (its writes, and on object stores its close, which uploads) are
        // the target's, not a damaged source.
        val checked = new java.io.FilterOutputStream(created) {
          override def write(b: Array[Byte], off: Int, len: Int): Unit =
            try created.write(b, off, len) catch { case e: IOException => throw writeFailed(e) }
          override def close(): Unit = try created.close() catch { case e: IOException => throw writeFailed(e) }
        }
        try copy(in, checked, crc) finally checked.close()
      } catch {
        case e: CheckpointFileException => throw e
        case e: IOException => throw KeyedStateErrors.fileCorrupt(
          s"State file $source needed by version $version is unreadable: ${e.getMessage}", e)
      } finally in.close()
    requireIntact(source, version, file, copied, Some(crc.getValue))
  }

  /** Deletes a file; one the file system refused to delete is logged and left (retention
   * tries again), never taken for gone. */
  def delete(path: Path): Unit =
    try {
      if (!fs.delete(path, false) && fs.exists(path)) {
        logWarning(s"The file system did not delete $path; it stays until the next cleanup")
      }
    } catch { case _: java.io.FileNotFoundException => () }
}

object CheckpointStore {
  /** A savepoint's metadata, at its root (`savepoint.SavepointMetadata`): no store under it is written. */
  val SavepointMetadataFile = "_savepoint.json"
  val SharedDir = "shared"
  val PrivateDir = "private"
  val ChangelogDir = "changelog"
  private val ManifestSuffix = ".manifest"
  private val SnapshotSuffix = ".snapshot"

  def manifestName(version: Long, checkpointId: Option[String]): String =
    checkpointId.fold(s"$version$ManifestSuffix")(id => s"${version}_$id$ManifestSuffix")

  def parseManifestName(name: String): Option[(Long, Option[String])] = parseName(name, ManifestSuffix)

  private def parseName(name: String, suffix: String): Option[(Long, Option[String])] =
    if (!name.endsWith(suffix) || name.startsWith(".")) None
    else {
      val stem = name.stripSuffix(suffix)
      stem.split("_", 2) match {
        case Array(v) => v.toLongOption.map(_ -> None)
        case Array(v, id) => v.toLongOption.map(_ -> Some(id))
        case _ => None
      }
    }

  /** The file at `path` as UTF-8 text; a missing file throws `missing`'s error. */
  def readText(fs: FileSystem, path: Path)(missing: java.io.FileNotFoundException => Throwable): String =
    try {
      val in = fs.open(path)
      try new String(in.readAllBytes(), UTF_8) finally in.close()
    } catch {
      case e: java.io.FileNotFoundException => throw missing(e)
    }

  /** Copies `in` to `out`, adding the bytes to `crc`; returns how many were copied. */
  def copy(in: InputStream, out: OutputStream, crc: CRC32C): Long = {
    val buf = new Array[Byte](1 << 16)
    var total = 0L
    var n = in.read(buf)
    while (n >= 0) {
      out.write(buf, 0, n)
      crc.update(buf, 0, n)
      total += n
      n = in.read(buf)
    }
    total
  }
}
