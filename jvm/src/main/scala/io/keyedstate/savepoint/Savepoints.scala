package io.keyedstate.savepoint

import java.nio.charset.StandardCharsets.UTF_8
import java.util.zip.CRC32C

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.SPARK_VERSION
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state.StateStoreId

import io.keyedstate.checkpoint.CheckpointStore
import io.keyedstate.conf.{KeyedStateConf, KeyedStateErrors}
import io.keyedstate.errors.ErrorId
import io.keyedstate.rescale.{OfflineJob, QueryCheckpoint, RescaleTasks, Rescaler, StoreRef}

/** One store partition's committed version, copied with its manifest from one root to another. */
final case class StoreCopy(store: StoreRef, sourceDir: String, targetDir: String, version: Long, checkpointId: Option[String])

/** What a copy wrote: the files (relative to the target root) and the function its manifest declares. */
final case class CopiedStore(store: StoreRef, files: Seq[SavepointFile], function: String, uid: String)

/** What a restore did. */
final case class RestoreResult(savepoint: String, checkpoint: String, batchId: Long, fromPartitions: Int,
    toPartitions: Int, bytes: Long, totalMs: Long)

/**
 * Savepoints (docs/savepoints.md): a user-triggered image of a query's state at one committed
 * batch, kept until the user disposes of it. A native savepoint is laid out as a checkpoint
 * holding one batch: every store partition's committed version (its manifest and the files it
 * lists, copied and checked against their CRC32C), the query's logs up to that batch, and
 * `_savepoint.json`, written last. So a restore is a copy into a new checkpoint, or a rescale of
 * the savepoint into one at another partition count; and a savepoint of a running query reads
 * only files its commits never change.
 */
final class Savepoints(spark: SparkSession, progress: String => Unit) {
  import Savepoints._

  private val hadoopConf = QueryCheckpoint.hadoopConf(spark)
  private lazy val conf = KeyedStateConf.fromMap(spark.conf.getAll)

  /** A native savepoint of `checkpoint` (running or stopped) at its last committed batch, at `target`. */
  def create(checkpoint: String, target: String): SavepointMetadata = {
    val started = System.currentTimeMillis()
    val src = QueryCheckpoint.at(checkpoint, hadoopConf)
    val batch = src.lastCommit()
    src.requireKeyedStateProvider(batch, "savepoint")
    val partitions = src.pinnedConf(batch).get(QueryCheckpoint.PartitionsKey).flatMap(_.toIntOption).getOrElse(
      throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid,
        s"${src.offsetPath(batch)} does not pin ${QueryCheckpoint.PartitionsKey}"))
    val dst = QueryCheckpoint.at(target, hadoopConf)
    refuseOverlap(src, dst)
    if (src.fs.exists(new Path(src.root, QueryCheckpoint.RescaleDir))) {
      throw KeyedStateErrors.badState(ErrorId.RescaleInProgress, s"${src.root} is held by an unfinished rescale " +
        s"(${new Path(src.root, QueryCheckpoint.RescaleDir)}): run the rescale again to finish it, then take the savepoint")
    }
    prepareTarget(dst)
    val usesIds = src.usesCheckpointIds(batch)
    val stores = for (op <- src.operators; store <- src.storeNames(op, 0)) yield op -> store
    if (usesIds && stores.exists(_._2 != StateStoreId.DEFAULT_STORE_NAME)) {
      throw KeyedStateErrors.unsupported(ErrorId.QueryCheckpointInvalid, s"${src.root} keeps several state stores " +
        "per operator (a stream-stream join) and its commits record state checkpoint ids (checkpoint format v2): " +
        "a savepoint reads such a query with format v1 only")
    }
    val version = batch + 1
    val tasks = storeCopies(src, dst, stores, batch, partitions, usesIds)
    progress(s"savepoint of ${src.root} at batch $batch (state version $version, $partitions partitions, " +
      s"${stores.size} store(s)) to ${dst.root}")
    try {
      // The marker says the folder is a savepoint being written: only such a folder is dropped
      // when a savepoint is taken again into it (never a checkpoint given as the target).
      dst.writeFile(pendingMarker(dst), s"${src.root}\n")
      // The logs first, while the query's retention still keeps those of the batch. A batch the
      // query planned after it (a run stopped mid-batch, or running) comes along: a restored
      // query runs it again with the same offsets, as the query itself would have.
      val upTo = src.batches("offsets").find(_ > batch).getOrElse(batch)
      progress("copying the query's logs")
      val logs = src.metadataFiles()
        .filter(rel => batchOf(rel).forall(b => b <= upTo && (b <= batch || !rel.startsWith("commits/"))))
        .map(copyFile(src, dst, _))
      val needed = Seq("metadata", s"offsets/$batch", s"commits/$batch") ++
        (if (batch > 0) Seq(s"offsets/${batch - 1}") else Nil)
      val missing = needed.filterNot(n => logs.exists(_.path == n))
      if (missing.nonEmpty) {
        throw KeyedStateErrors.fileMissing(s"${missing.map(m => new Path(src.root, m)).mkString(", ")} of batch " +
          s"$batch is missing: the query's retention (spark.sql.streaming.minBatchesToRetain) may have deleted it " +
          "as the savepoint started; take the savepoint again")
      }
      val copied = OfflineJob.run(spark, "savepoint", "copy", tasks, RescaleTasks.fromHadoop(hadoopConf), conf,
        progress)((t: StoreCopy, h, _) => copyStore(t, h))
      val operators = stores.groupBy(_._1).toSeq.sortBy(_._1).map { case (op, s) =>
        val first = copied.find(c => c.store.operatorId == op && c.store.partition == 0)
        SavepointOperator(op, src.operatorName(op), s.map(_._2), first.map(_.function).getOrElse(""),
          first.map(_.uid).getOrElse(""))
      }
      val metadata = SavepointMetadata(SavepointMetadata.Native, SavepointMetadata.FormatVersion, KeyedstateVersion,
        SPARK_VERSION, System.currentTimeMillis(), src.root.toString, batch, version, partitions,
        QueryCheckpoint.OurProvider, usesIds, operators, copied.flatMap(_.files) ++ logs)
      writeMetadata(dst, metadata)
      dst.fs.delete(pendingMarker(dst), false)
      progress(s"savepoint written: ${metadata.files.size} files, ${metadata.totalBytes} bytes in " +
        s"${(System.currentTimeMillis() - started) / 1000.0} s")
      metadata
    } catch {
      case NonFatal(e) =>
        // Without its metadata the folder is no savepoint; drop it so that nothing looks complete.
        dst.fs.delete(dst.root, true)
        throw e
    }
  }

  /**
   * A new checkpoint at `checkpoint` from the savepoint at `savepoint`, from which the query
   * resumes after the savepoint's batch: a copy, or at `partitions` a rescale of the savepoint.
   */
  def restore(savepoint: String, checkpoint: String, partitions: Option[Int]): RestoreResult = {
    val started = System.currentTimeMillis()
    val sp = QueryCheckpoint.at(savepoint, hadoopConf)
    val metadata = SavepointMetadata.read(sp.fs, sp.root)
    val dst = QueryCheckpoint.at(checkpoint, hadoopConf)
    if (dst.exists && dst.fs.listStatus(dst.root).nonEmpty) {
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
        s"restore: ${dst.root} is not empty; a restore writes a new checkpoint")
    }
    verify(sp, metadata, stateFiles = false) // state files are checked against their manifests as they are read
    val to = partitions.getOrElse(metadata.partitions)
    if (to < 1) {
      throw KeyedStateErrors.badArgument(ErrorId.RescaleRefused, s"Invalid partition count $to for restore: allowed " +
        s"is an integer from 1 to ${Rescaler.MaxPartitions}")
    }
    if (to != metadata.partitions) {
      progress(s"restoring ${sp.root} (batch ${metadata.batchId}) into ${dst.root} at $to partitions " +
        s"(the savepoint has ${metadata.partitions})")
      val rescaled =
        try new Rescaler(spark, progress).run(sp.root.toString, to, Some(dst.root.toString), inPlace = false)
        catch {
          case NonFatal(e) =>
            dst.fs.delete(dst.root, true) // a failed restore leaves no checkpoint behind
            throw e
        }
      return RestoreResult(sp.root.toString, dst.root.toString, metadata.batchId, metadata.partitions, to,
        rescaled.bytesWritten, System.currentTimeMillis() - started)
    }
    progress(s"restoring ${sp.root} (batch ${metadata.batchId}) into ${dst.root}")
    try {
      val stores = for (op <- metadata.operators; store <- op.stores) yield op.operatorId -> store
      val tasks = storeCopies(sp, dst, stores, metadata.batchId, metadata.partitions, metadata.checkpointIds)
      val copied = OfflineJob.run(spark, "restore", "copy", tasks, RescaleTasks.fromHadoop(hadoopConf), conf,
        progress)((t: StoreCopy, h, _) => copyStore(t, h))
      val stateFiles = copied.flatMap(_.files).map(_.path).toSet
      val logs = metadata.files.filterNot(f => stateFiles(f.path)).map(f => copyFile(sp, dst, f.path))
      RestoreResult(sp.root.toString, dst.root.toString, metadata.batchId, metadata.partitions, to,
        (copied.flatMap(_.files) ++ logs).iterator.map(_.size).sum, System.currentTimeMillis() - started)
    } catch {
      case NonFatal(e) =>
        dst.fs.delete(dst.root, true)
        throw e
    }
  }

  /** The savepoint's metadata; with `verifyFiles`, every file it lists is read and checked. */
  def inspect(savepoint: String, verifyFiles: Boolean): SavepointMetadata = {
    val sp = QueryCheckpoint.at(savepoint, hadoopConf)
    val metadata = SavepointMetadata.read(sp.fs, sp.root)
    verify(sp, metadata, stateFiles = verifyFiles)
    metadata
  }

  /** The savepoints directly under `directory`, oldest first. */
  def list(directory: String): Seq[(String, SavepointMetadata)] = {
    val dir = QueryCheckpoint.qualify(directory, hadoopConf)
    val fs = dir.getFileSystem(hadoopConf)
    if (!fs.exists(dir)) throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"no directory $dir")
    fs.listStatus(dir).toSeq.filter(_.isDirectory)
      .filter(st => fs.exists(SavepointMetadata.path(st.getPath)))
      .map(st => st.getPath.toString -> SavepointMetadata.read(fs, st.getPath))
      .sortBy(_._2.createdAtMs)
  }

  /** Deletes what the savepoint owns: the files it lists, its metadata, and folders left empty. */
  def dispose(savepoint: String): SavepointMetadata = {
    val sp = QueryCheckpoint.at(savepoint, hadoopConf)
    val metadata = SavepointMetadata.read(sp.fs, sp.root)
    // The metadata goes first: a dispose stopped half-way leaves no savepoint that looks whole.
    sp.fs.delete(SavepointMetadata.path(sp.root), false)
    metadata.files.foreach(f => sp.fs.delete(new Path(sp.root, f.path), false))
    deleteEmptyFolders(sp.fs, sp.root)
    metadata
  }

  private def deleteEmptyFolders(fs: FileSystem, dir: Path): Unit = {
    // An object store has no empty folders: one whose files went may be gone already.
    def entries = try fs.listStatus(dir).toSeq catch { case _: java.io.FileNotFoundException => Nil }
    entries.filter(_.isDirectory).foreach(st => deleteEmptyFolders(fs, st.getPath))
    // Hadoop's local checksum files of the deleted files may remain: they belong to no one.
    if (entries.forall(st => st.isFile && st.getPath.getName.endsWith(".crc"))) fs.delete(dir, true)
  }

  /** Checks every listed file's size (and, for the logs and manifests or all with `stateFiles`, CRC32C). */
  private def verify(sp: QueryCheckpoint, metadata: SavepointMetadata, stateFiles: Boolean): Unit =
    metadata.files.foreach { f =>
      val path = new Path(sp.root, f.path)
      val isStateData = f.path.startsWith("state/") && !f.path.endsWith(".manifest") && isStoreFile(f.path)
      if (stateFiles || !isStateData) {
        val (size, crc) = checksum(sp.fs, path, s"Savepoint file $path")
        if (size != f.size || crc != f.crc32c) {
          throw KeyedStateErrors.fileCorrupt(f"Savepoint file $path is damaged: $size bytes, CRC32C $crc%08x; " +
            f"${SavepointMetadata.path(sp.root)} says ${f.size} bytes, ${f.crc32c}%08x")
        }
      } else if (!sp.fs.exists(path)) {
        throw KeyedStateErrors.fileMissing(s"Savepoint file $path is missing (listed in ${SavepointMetadata.path(sp.root)})")
      }
    }

  /**
   * One copy per store partition of version `batch + 1`, from `from` to `to`; under format v2 by
   * the checkpoint ids the commit of `batch` records (read once per operator).
   */
  private def storeCopies(from: QueryCheckpoint, to: QueryCheckpoint, stores: Seq[(Int, String)], batch: Long,
      partitions: Int, usesIds: Boolean): Seq[StoreCopy] =
    stores.flatMap { case (op, store) =>
      val ids = if (usesIds) from.defaultStoreCheckpointIds(batch, op, 0 until partitions) else Map.empty[Int, String]
      (0 until partitions).map { p =>
        val ref = StoreRef(op, store, p)
        StoreCopy(ref, from.storeDir(ref).toString, to.storeDir(ref).toString, batch + 1, ids.get(p))
      }
    }

  private def pendingMarker(dst: QueryCheckpoint): Path = new Path(dst.root, PendingMarker)

  /** A savepoint is never written into its checkpoint, nor a checkpoint into it. */
  private def refuseOverlap(src: QueryCheckpoint, dst: QueryCheckpoint): Unit = {
    def within(a: Path, b: Path) = a == b || a.toString.startsWith(b.toString.stripSuffix("/") + "/")
    if (within(dst.root, src.root) || within(src.root, dst.root)) {
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"savepoint: the target ${dst.root} and " +
        s"the checkpoint ${src.root} overlap; a savepoint goes into a folder of its own")
    }
  }

  /**
   * A savepoint's target: new, or empty, or what a savepoint that died before its metadata left
   * (its pending marker says so; dropped). A savepoint, or anything else, is refused.
   */
  private def prepareTarget(dst: QueryCheckpoint): Unit = if (dst.exists) {
    if (dst.fs.exists(SavepointMetadata.path(dst.root))) {
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"savepoint: ${dst.root} already holds a " +
        "savepoint; dispose of it or choose another target")
    }
    if (dst.fs.listStatus(dst.root).nonEmpty) {
      if (!dst.fs.exists(pendingMarker(dst))) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
          s"savepoint: ${dst.root} is not empty and holds no savepoint; choose a new target")
      }
      progress(s"dropping the unfinished savepoint at ${dst.root} (no ${SavepointMetadata.FileName})")
      dst.fs.delete(dst.root, true)
    }
  }

  private def writeMetadata(dst: QueryCheckpoint, metadata: SavepointMetadata): Unit = {
    val tmp = new Path(dst.root, s".${SavepointMetadata.FileName}.tmp")
    val out = dst.fs.create(tmp, true)
    try out.write(SavepointMetadata.toJson(metadata).getBytes(UTF_8)) finally out.close()
    if (!dst.fs.rename(tmp, SavepointMetadata.path(dst.root))) {
      throw KeyedStateErrors.checkpointWrite(s"Cannot publish ${SavepointMetadata.path(dst.root)}: the rename of $tmp failed")
    }
  }

  private def copyFile(from: QueryCheckpoint, to: QueryCheckpoint, relative: String): SavepointFile = {
    val source = new Path(from.root, relative)
    val target = new Path(to.root, relative)
    val crc = new CRC32C()
    val in =
      try from.fs.open(source)
      catch {
        case e: java.io.FileNotFoundException => throw KeyedStateErrors.fileMissing(s"$source is missing", e)
      }
    val size =
      try {
        val out = to.fs.create(target, false)
        try CheckpointStore.copy(in, out, crc) finally out.close()
      } finally in.close()
    SavepointFile(relative, size, crc.getValue)
  }
}

object Savepoints {
  val KeyedstateVersion: String = Option(classOf[Savepoints].getPackage.getImplementationVersion).getOrElse("0.1.0")

  /** In a savepoint's folder while it is written, removed once `_savepoint.json` is. */
  val PendingMarker = ".keyedstate-savepoint-pending"

  /** The batch a query log's file belongs to (`offsets/12`, `sources/0/12.compact`, `.../12_<uuid>`), if any. */
  def batchOf(relative: String): Option[Long] = {
    val name = relative.substring(relative.lastIndexOf('/') + 1)
    val logged = Seq("offsets/", "commits/", "sources/", "state/").exists(relative.startsWith)
    if (!logged) None else name.takeWhile(_.isDigit).toLongOption
  }

  /** A file of a store's own layout (SST, private, changelog), as opposed to Spark's metadata under `state/`. */
  private def isStoreFile(relative: String): Boolean =
    Seq(CheckpointStore.SharedDir, CheckpointStore.PrivateDir, CheckpointStore.ChangelogDir)
      .exists(d => relative.contains(s"/$d/"))

  private def checksum(fs: FileSystem, path: Path, what: String): (Long, Long) = {
    val crc = new CRC32C()
    val in =
      try fs.open(path)
      catch { case e: java.io.FileNotFoundException => throw KeyedStateErrors.fileMissing(s"$what is missing", e) }
    val size =
      try CheckpointStore.copy(in, java.io.OutputStream.nullOutputStream(), crc)
      catch {
        // Hadoop's own checksums (a local file's .crc) may see the damage first.
        case e: java.io.IOException => throw KeyedStateErrors.fileCorrupt(s"$what is damaged: ${e.getMessage}", e)
      } finally in.close()
    (size, crc.getValue)
  }

  /** Executor side: copies one store partition's version and its manifest, each file checked. */
  def copyStore(task: StoreCopy, hadoopSettings: Map[String, String]): CopiedStore = {
    val hadoopConf: Configuration = RescaleTasks.toHadoop(hadoopSettings)
    val source = new CheckpointStore(new Path(task.sourceDir), hadoopConf)
    val target = new CheckpointStore(new Path(task.targetDir), hadoopConf)
    val manifest = source.readManifest(task.version, task.checkpointId)
    target.ensureRoot()
    manifest.allFiles.foreach(f => source.copyTo(f, task.version, target))
    target.writeManifest(manifest, checkpointIdsEnabled = task.checkpointId.isDefined)
    val manifestPath = target.manifestPath(task.version, task.checkpointId)
    val dir = task.store.describe // state/<op>/<partition>[/<store>], relative to the root
    val (size, crc) = checksum(manifestPath.getFileSystem(hadoopConf), manifestPath, s"manifest $manifestPath")
    val files = manifest.allFiles.map(f => SavepointFile(s"$dir/${f.path}", f.size, f.crc32c)) :+
      SavepointFile(s"$dir/${manifestPath.getName}", size, crc)
    CopiedStore(task.store, files, manifest.declaredFunction.getOrElse(""), manifest.declaredUid.getOrElse(""))
  }
}
