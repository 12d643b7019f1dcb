package io.keyedstate.offline.savepoint

import java.util.zip.CRC32C

import scala.util.control.NonFatal

import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.SPARK_VERSION
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state.StateStoreId

import io.keyedstate.checkpoint.CheckpointStore
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{CheckpointFileException, ErrorId, KeyedStateErrors}
import io.keyedstate.offline.{QueryCheckpoint, SavepointFile, SavepointMetadata, StateTables}
import io.keyedstate.offline.rescale.Rescaler
import io.keyedstate.engine.{PendingRestore, RestoreMapping, SavedFunction}

/** What a restore did. */
final case class RestoreResult(savepoint: String, checkpoint: String, batchId: Long, fromPartitions: Int,
    toPartitions: Int, bytes: Long, totalMs: Long)

/**
 * Savepoints (docs/savepoints.md): a user-triggered image of a query's state at one committed
 * batch, kept until the user disposes of it. Every savepoint holds the query's logs up to that
 * batch and `_savepoint.json`, written last; its state is held by a [[SavepointFormat]]: native
 * ([[NativeFormat]]) or canonical ([[CanonicalFormat]]). A savepoint of a running query reads
 * only committed state, which the query's later commits never change.
 */
final class Savepoints(spark: SparkSession, progress: String => Unit) {
  import Savepoints._

  private val hadoopConf = QueryCheckpoint.hadoopConf(spark)
  private lazy val conf = KeyedStateConf.fromMap(spark.conf.getAll)

  private def formatOf(format: String): SavepointFormat = format match {
    case SavepointMetadata.Native => new NativeFormat(spark, hadoopConf, conf, progress)
    case SavepointMetadata.Canonical =>
      new CanonicalFormat(spark, hadoopConf, progress, new NativeFormat(spark, hadoopConf, conf, progress))
    case other => throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"Invalid savepoint format " +
      s"'$other': allowed are ${SavepointMetadata.Formats.mkString(", ")}")
  }

  /**
   * A savepoint of `checkpoint` (running or stopped) at its last committed batch, at `target`.
   * `bootstrap`: the state only, without the query's logs (a bootstrapping query's state,
   * `keyedstate.state.bootstrap`), as the state a new query starts from.
   */
  def create(checkpoint: String, target: String, format: String = SavepointMetadata.Native,
      bootstrap: Boolean = false): SavepointMetadata = {
    val strategy = formatOf(format)
    val src = QueryCheckpoint.at(checkpoint, hadoopConf)
    val batch = src.lastCommit()
    // Each step of the writing waits for a gap between the running query's batches (if one runs).
    val gaps = new BatchGaps(src, batch, () => src.runningQueries(spark).exists(_.status.isTriggerActive),
      progress = progress)
    val partitions = src.pinnedConf(batch).get(QueryCheckpoint.PartitionsKey).flatMap(_.toIntOption).getOrElse(
      throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid,
        s"${src.offsetPath(batch)} does not pin ${QueryCheckpoint.PartitionsKey}"))
    val dst = new SavepointTarget(QueryCheckpoint.at(target, hadoopConf), progress)
    dst.refuseOverlap(src)
    if (src.fs.exists(new Path(src.root, QueryCheckpoint.RescaleDir))) {
      throw KeyedStateErrors.badState(ErrorId.RescaleInProgress, s"${src.root} is held by an unfinished rescale " +
        s"(${new Path(src.root, QueryCheckpoint.RescaleDir)}): run the rescale again to finish it, then take the savepoint")
    }
    dst.prepare()
    val usesIds = src.usesCheckpointIds(batch)
    Savepoints.refuseSeveralStoresWithIds(src, usesIds)
    strategy.check(src, batch)
    val version = batch + 1
    progress(s"${strategy.name} savepoint of ${src.root} at batch $batch (state version $version, " +
      s"$partitions partitions) to ${dst.folder.root}")
    dst.writing(src.root) {
      val upTo = src.batches("offsets").find(_ > batch).getOrElse(batch)
      if (!bootstrap) progress("copying the query's logs")
      val logs = if (bootstrap) Nil else src.metadataFiles().filter(keepsLog(_, batch, upTo))
        .flatMap { rel => gaps.await(); copyLog(src, dst.folder, rel, batch) }
      val needed = if (bootstrap) Nil else Seq("metadata", s"offsets/$batch", s"commits/$batch") ++
        (if (batch > 0) Seq(s"offsets/${batch - 1}") else Nil)
      val missing = needed.filterNot(n => logs.exists(_.path == n))
      if (missing.nonEmpty) {
        throw KeyedStateErrors.fileMissing(s"${missing.map(m => new Path(src.root, m)).mkString(", ")} of batch " +
          s"$batch is missing: the query's retention (spark.sql.streaming.minBatchesToRetain) may have deleted it " +
          "as the savepoint started; take the savepoint again")
      }
      val (operators, stateFiles) = strategy.write(src, dst.folder, batch, partitions, usesIds, gaps)
      if (gaps.totalWaitMs > 0) progress(s"waited ${gaps.totalWaitMs} ms in all for the query's batches")
      // A bootstrap's state is version 0: the state before a new query's first batch.
      val (savedBatch, savedVersion) = if (bootstrap) (-1L, 0L) else (batch, version)
      SavepointMetadata(strategy.name, SavepointMetadata.FormatVersion, KeyedstateVersion, SPARK_VERSION,
        System.currentTimeMillis(), src.root.toString, savedBatch, savedVersion, partitions,
        src.pinnedConf(batch).getOrElse(QueryCheckpoint.ProviderKey, QueryCheckpoint.SparkDefaultProvider), usesIds,
        operators, stateFiles ++ logs)
    }
  }

  /**
   * A new checkpoint at `checkpoint` from the savepoint at `savepoint`, from which the query
   * resumes after the savepoint's batch, at `partitions` (default: the savepoint's count); a
   * canonical savepoint's state may go into another `provider` (the class pinned for the query).
   */
  def restore(savepoint: String, checkpoint: String, partitions: Option[Int], provider: Option[String] = None,
      allowNonRestoredState: Boolean = false): RestoreResult = {
    val started = System.currentTimeMillis()
    val sp = QueryCheckpoint.at(savepoint, hadoopConf)
    val metadata = SavepointMetadata.read(sp.fs, sp.root)
    val dst = QueryCheckpoint.at(checkpoint, hadoopConf)
    val unfinished = new Path(dst.root, RestoreMapping.UnfinishedMarker)
    if (dst.exists && dst.fs.exists(unfinished)) {
      progress(s"dropping the unfinished output of an interrupted restore at ${dst.root}")
      dst.fs.delete(dst.root, true)
    } else if (dst.exists && dst.fs.listStatus(dst.root).nonEmpty) {
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
        s"restore: ${dst.root} is not empty; a restore writes a new checkpoint")
    }
    // A native savepoint's state files are checked against their manifests as they are read.
    verify(sp, metadata, stateFiles = metadata.format != SavepointMetadata.Native)
    // A bootstrapped savepoint starts a new query, whose partition count is the session's.
    val to = partitions.getOrElse(
      if (metadata.batchId < 0) spark.sessionState.conf.numShufflePartitions else metadata.partitions)
    if (to < 1 || to > Rescaler.MaxPartitions) {
      throw KeyedStateErrors.badArgument(ErrorId.RescaleRefused, s"Invalid partition count $to for restore: allowed " +
        s"is an integer from 1 to ${Rescaler.MaxPartitions}")
    }
    progress(s"restoring ${sp.root} (${metadata.format}, batch ${metadata.batchId}) into ${dst.root} at $to " +
      s"partitions (the savepoint has ${metadata.partitions})")
    val bytes =
      try {
        // Created new: a second restore into the folder at the same time fails here.
        dst.writeFile(unfinished, s"${sp.root}\n", overwrite = false)
        val written = formatOf(metadata.format).restore(sp, metadata, dst, to, provider)
        leaveMapping(sp, metadata, dst, allowNonRestoredState, to)
        if (!dst.fs.delete(unfinished, false) && dst.fs.exists(unfinished)) {
          throw KeyedStateErrors.checkpointWrite(s"The file system did not delete $unfinished")
        }
        written
      } catch {
        case NonFatal(e) =>
          // A failed restore leaves no checkpoint behind; the marker goes last, so a cleanup
          // cut short still leaves nothing a query starts on.
          if (dst.fs.exists(dst.root)) {
            dst.fs.listStatus(dst.root).filter(_.getPath.getName != RestoreMapping.UnfinishedMarker)
              .foreach(f => dst.fs.delete(f.getPath, true))
            dst.fs.delete(dst.root, true)
          }
          throw e
      }
    RestoreResult(sp.root.toString, dst.root.toString, metadata.batchId, metadata.partitions, to, bytes,
      System.currentTimeMillis() - started)
  }

  /**
   * The savepoint's keyed functions, for the restored query's first batch to map to its own by
   * uid ([[RestoreMapping]]): the query may add, remove or reorder keyed functions.
   */
  private def leaveMapping(sp: QueryCheckpoint, metadata: SavepointMetadata, dst: QueryCheckpoint,
      allowNonRestoredState: Boolean, partitions: Int): Unit = {
    val tables = StateTables(sp, metadata)
    val functions = metadata.operators.flatMap(o => tables.declarationOf(o.operatorId).map(d =>
      SavedFunction(o.operatorId, d.uid, d.function, d.states.map(_.name))))
    // A bootstrap's partition count is checked when the new query starts, whatever its operators.
    if (functions.nonEmpty || metadata.batchId < 0) {
      RestoreMapping.write(dst.root, hadoopConf, PendingRestore(metadata.batchId, allowNonRestoredState, functions,
        partitions))
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


}

object Savepoints {
  /**
   * Under format v2 a commit records one id per store of an operator, in an order Spark does not
   * publish for a stream-stream join's four stores: such a query is refused, not guessed at.
   */
  private def refuseSeveralStoresWithIds(src: QueryCheckpoint, usesCheckpointIds: Boolean): Unit =
    if (usesCheckpointIds && src.operators.exists(op => src.storeNames(op, 0).exists(_ != StateStoreId.DEFAULT_STORE_NAME))) {
      throw KeyedStateErrors.unsupported(ErrorId.QueryCheckpointInvalid, s"${src.root} keeps several state stores " +
        "per operator (a stream-stream join) and its commits record state checkpoint ids (checkpoint format v2): " +
        "a savepoint reads such a query with format v1 only")
    }

  val KeyedstateVersion: String = Option(classOf[Savepoints].getPackage.getImplementationVersion).getOrElse("0.1.0")

  /** In a savepoint's folder while it is written, removed once `_savepoint.json` is. */
  val PendingMarker = ".keyedstate-savepoint-pending"

  /** Deletes the folders under `dir` (and `dir`) that hold no file. */
  def deleteEmptyFolders(fs: FileSystem, dir: Path): Unit = {
    // An object store has no empty folders: one whose files went may be gone already.
    def entries = try fs.listStatus(dir).toSeq catch { case _: java.io.FileNotFoundException => Nil }
    entries.filter(_.isDirectory).foreach(st => deleteEmptyFolders(fs, st.getPath))
    // Hadoop's local checksum files of the deleted files may remain: they belong to no one.
    if (entries.forall(st => st.isFile && st.getPath.getName.endsWith(".crc"))) fs.delete(dir, true)
  }

  /** Copies a file of `from` to the same place under `to`, with its size and CRC32C. */
  def copyFile(from: QueryCheckpoint, to: QueryCheckpoint, relative: String): SavepointFile = {
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

  /**
   * Whether a savepoint at `batch` keeps a file of the query's logs (`upTo`: the last planned
   * batch): the offset log from the batch before (a restart reads the previous batch's offsets)
   * to `upTo`, the commit log of those two batches, and every other log file up to `upTo` (a
   * file source's log since its last compaction, Spark's operator metadata and schemas).
   */
  private def keepsLog(relative: String, batch: Long, upTo: Long): Boolean = batchOf(relative) match {
    case Some(b) if relative.startsWith("offsets/") => b >= batch - 1 && b <= upTo
    case Some(b) if relative.startsWith("commits/") => b >= batch - 1 && b <= batch
    case Some(b) => b <= upTo
    case None => true
  }

  /**
   * A log file copied; None when the running query's retention deleted an entry older than
   * the batch before `batch` while the savepoint ran (a file source's log, compacted since).
   */
  private def copyLog(from: QueryCheckpoint, to: QueryCheckpoint, relative: String, batch: Long): Option[SavepointFile] =
    try Some(
      // The savepoint's versions are saved under version names alone (NativeFormat.copy), so
      // its commits keep no state checkpoint ids.
      batchOf(relative).filter(_ => relative.startsWith("commits/")).flatMap(from.commitWithoutCheckpointIds) match {
        case Some(text) =>
          val target = new Path(to.root, relative)
          to.writeFile(target, text)
          val (size, crc) = checksum(to.fs, target, s"Savepoint file $target")
          SavepointFile(relative, size, crc)
        case None => copyFile(from, to, relative)
      })
    catch {
      case _: CheckpointFileException
          if batchOf(relative).exists(_ < batch - 1) && !from.fs.exists(new Path(from.root, relative)) => None
    }

  /** The batch a query log's file belongs to (`offsets/12`, `sources/0/12.compact`, `.../12_<uuid>`), if any. */
  def batchOf(relative: String): Option[Long] = {
    val name = relative.substring(relative.lastIndexOf('/') + 1)
    val logged = Seq("offsets/", "commits/", "sources/", "state/").exists(relative.startsWith)
    if (!logged) None else name.takeWhile(_.isDigit).toLongOption
  }

  /** A file of a store's own layout (SST, private, changelog), as opposed to Spark's metadata under `state/`. */
  def isStoreFile(relative: String): Boolean =
    Seq(CheckpointStore.SharedDir, CheckpointStore.PrivateDir, CheckpointStore.ChangelogDir)
      .exists(d => relative.contains(s"/$d/"))

  def checksum(fs: FileSystem, path: Path, what: String): (Long, Long) = {
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
}
