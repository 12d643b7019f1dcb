package io.keyedstate.offline.rescale

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state.{KeyedStateCoordinatorBridge, StateStoreId, StateStoreProviderId}
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

import io.keyedstate.checkpoint.{InlineEntry, LeaseHolder, RescaleJournal, StoreLease}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.engine.RestoreMapping
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.offline.{CheckpointWriter, OfflineJob, Progress, QueryCheckpoint, StoreRef}

/** What a rescale did. */
final case class RescaleResult(
    source: String,
    output: String,
    inPlace: Boolean,
    fromPartitions: Int,
    toPartitions: Int,
    batchId: Long,
    stateVersion: Long,
    operators: Seq[Int],
    stores: Int,
    keys: Long,
    bytesWritten: Long,
    splitMs: Long,
    buildMs: Long,
    totalMs: Long,
    resumed: Boolean)

/**
 * Rewrites the state of every stateful operator of a stopped query's checkpoint for another
 * partition count, as a Spark job, so that the restarted query runs with the new count.
 *
 * The state of the last committed batch B (state version B+1) is split by key-group tag into
 * per-target SST files (one task per source partition), then each target partition's RocksDB is
 * built from them (one task per target) and committed as version B+1. The offset log entry of B
 * then pins the new partition count and the operator metadata says it too; nothing else of the
 * query changes, so the restarted query continues with batch B+1.
 *
 * By default the result is a new checkpoint (`output`) and the source is only read. In place,
 * a journal makes it crash-safe: see [[RescaleJournal]].
 */
final class Rescaler(spark: SparkSession, progress: String => Unit) {
  import QueryCheckpoint._

  private val hadoopConf = QueryCheckpoint.hadoopConf(spark)
  private lazy val conf = KeyedStateConf.fromMap(spark.conf.getAll)

  /** `restoring`: the output is a savepoint's restore, marked as unfinished until it ends. */
  def run(source: String, partitions: Int, output: Option[String], inPlace: Boolean,
      restoring: Boolean = false): RescaleResult = {
    if (partitions < 1 || partitions > Rescaler.MaxPartitions) {
      throw KeyedStateErrors.badArgument(ErrorId.RescaleRefused,
        s"Invalid partition count $partitions for rescale: allowed is an integer from 1 to ${Rescaler.MaxPartitions}")
    }
    if (inPlace && output.exists(o => qualify(o) != qualify(source))) {
      throw KeyedStateErrors.badArgument(ErrorId.RescaleRefused, s"Rescale in place writes to the source; do not also give an output ($output)")
    }
    val src = QueryCheckpoint.at(source, hadoopConf)
    src.requireExists()
    val started = System.currentTimeMillis()

    // An interrupted in-place rescale is finished or undone first.
    val resumed = RescaleJournal.read(src.root, hadoopConf).filter(_.inPlace) match {
      case Some(j) if j.phase == RescaleJournal.Publishing =>
        progress(s"completing the interrupted in-place rescale to ${j.toPartitions} partitions")
        publishInPlace(src, j)
        if (j.toPartitions == partitions && inPlace) {
          return summary(src, src, j, inPlace = true, Nil, Nil, started, resumed = true)
        }
        true
      case Some(j) =>
        progress(s"undoing the interrupted in-place rescale to ${j.toPartitions} partitions (it had not published)")
        undoInPlace(src)
        false
      case None =>
        dropUnjournaled(src)
        false
    }

    val dst =
      if (inPlace) src
      else QueryCheckpoint.at(output.getOrElse(s"${src.root}-rescaled-$partitions"), hadoopConf)
    if (!inPlace) prepareOutput(src, dst, restoring)
    checkNotRunning(src)
    val batch = lastCommittedBatch(src)
    src.requireKeyedStateProvider(batch, "rescale")
    val pinned = src.pinnedConf(batch)
    if (src.usesCheckpointIds(batch)) {
      throw KeyedStateErrors.unsupported(ErrorId.RescaleRefused,
        s"${src.commitPath(batch)} carries state checkpoint ids (spark.sql.streaming.stateStore." +
          "checkpointFormatVersion=2): rescale rewrites checkpoint format version 1 only; take a savepoint and " +
          "restore it at the new count (a savepoint holds its versions without ids)")
    }
    val from = pinned.get(PartitionsKey).flatMap(_.toIntOption).getOrElse(throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid,
      s"${src.offsetPath(batch)} does not pin $PartitionsKey"))
    if (from == partitions) {
      throw KeyedStateErrors.badArgument(ErrorId.RescaleRefused,
        s"${src.root} already has $partitions state partitions (${src.offsetPath(batch)}): nothing to rescale")
    }
    val version = batch + 1
    val stores = discoverStores(src, from, version)
    checkNoLeases(src, stores, from)

    val journal = RescaleJournal(RescaleJournal.Building, src.root.toString, dst.root.toString, inPlace, batch,
      from, partitions, started)
    RescaleJournal.write(dst.root, journal, hadoopConf)
    val staging = new Path(new Path(dst.root, RescaleDir), "staging")
    try {
      progress(s"rescaling ${src.root} (batch $batch, state version $version) from $from to $partitions " +
        s"partitions: ${stores.size} store(s) of operator(s) ${stores.map(_._1).distinct.mkString(", ")}")
      val splitStart = System.currentTimeMillis()
      val splitTasks = for ((op, store) <- stores; p <- 0 until from) yield {
        val ref = StoreRef(op, store, p)
        SplitTask(ref, src.storeDir(ref).toString, version, from, partitions, staging.toString)
      }
      val splits = runTasks("split", splitTasks)((t: SplitTask, h, c) => RescaleTasks.split(t, h, c))
      val splitMs = System.currentTimeMillis() - splitStart

      val buildStart = System.currentTimeMillis()
      val operatorLists = stores.map { case (op, store) =>
        val mine = splits.filter(s => s.store.operatorId == op && s.store.storeName == store)
        (op, store) -> RescaledOperatorState.lists(op, store, declarationOf(op, store, mine), mine, from, partitions)
      }.toMap
      val buildTasks = for ((op, store) <- stores; t <- 0 until partitions) yield {
        val ref = StoreRef(op, store, t)
        val mine = splits.filter(s => s.store.operatorId == op && s.store.storeName == store)
        val files = mine.flatMap(_.staged).filter(_.target == t)
        val lists = operatorLists((op, store)).getOrElse(t, Map.empty)
        val families = mine.flatMap(_.columnFamilies).groupBy(_.name).values.map(_.head).toSeq.sortBy(_.name)
          .map(cf => cf.copy(numKeys = files.filter(_.columnFamily == cf.name).map(_.keys).sum +
            lists.get(cf.name).fold(0)(_.size)))
        val manifestDir = if (inPlace) Some(new Path(staging, s"manifests/$op/$store/$t").toString) else None
        BuildTask(ref, dst.storeDir(ref).toString, version, families, declarationOf(op, store, mine), files, lists,
          staging.toString, manifestDir)
      }
      val builds = runTasks("build", buildTasks)((t: BuildTask, h, c) => RescaleTasks.build(t, h, c))
      val buildMs = System.currentTimeMillis() - buildStart

      // The query must not have moved on meanwhile: its next batch would not see the new state.
      if (src.lastBatch("offsets") != Some(batch) || src.lastBatch("commits") != Some(batch)) {
        throw KeyedStateErrors.badState(ErrorId.RescaleRefused,
          s"The query ran past batch $batch of ${src.root} during the rescale: it is running. Stop it, then rescale.")
      }
      val publishing = journal.copy(phase = RescaleJournal.Publishing)
      RescaleJournal.write(dst.root, publishing, hadoopConf)
      if (inPlace) publishInPlace(src, publishing) else publishCopy(src, dst, publishing)
      val result = summary(src, dst, journal, inPlace, splits, builds, started, resumed)
      result.copy(splitMs = splitMs, buildMs = buildMs)
    } catch {
      case NonFatal(e) =>
        // Before publishing nothing the query reads was changed: drop what was written.
        if (RescaleJournal.read(dst.root, hadoopConf).exists(_.phase == RescaleJournal.Building)) {
          // A restore's output is dropped by the restore, its unfinished marker last.
          if (inPlace) undoInPlace(src) else if (!restoring) dst.fs.delete(dst.root, true)
        }
        throw e
    }
  }

  /** The operator's declaration, the same in every source partition's manifest (it is written per batch). */
  private def declarationOf(op: Int, store: String, splits: Seq[SplitResult]): Option[String] =
    splits.map(_.declarationJson).distinct match {
      case Seq(one) => one
      case several => throw KeyedStateErrors.badState(ErrorId.RescaleRefused,
        s"the partitions of operator $op (store '$store') record ${several.size} different declarations of their " +
          "state in their manifests: the state cannot be rescaled safely")
    }

  private def summary(
      src: QueryCheckpoint,
      dst: QueryCheckpoint,
      j: RescaleJournal,
      inPlace: Boolean,
      splits: Seq[SplitResult],
      builds: Seq[BuildResult],
      started: Long,
      resumed: Boolean): RescaleResult =
    RescaleResult(src.root.toString, dst.root.toString, inPlace, j.fromPartitions, j.toPartitions, j.batchId,
      j.batchId + 1, builds.map(_.store.operatorId).distinct.sorted,
      builds.map(b => (b.store.operatorId, b.store.storeName)).distinct.size, splits.map(_.keys).sum,
      builds.map(_.bytesUploaded).sum, 0, 0, System.currentTimeMillis() - started, resumed)

  private def qualify(path: String): Path = QueryCheckpoint.qualify(path, hadoopConf)

  /** A fresh output, or the leftovers of an interrupted rescale into it (which are ours to drop). */
  private def prepareOutput(src: QueryCheckpoint, dst: QueryCheckpoint, restoring: Boolean): Unit = if (dst.exists) {
    RescaleJournal.read(dst.root, hadoopConf) match {
      // No query can have used it (the journal kept the provider off): redo it from the source.
      case Some(j) if j.source == src.root.toString =>
        progress(s"dropping the unfinished output of an interrupted rescale at ${dst.root}")
        dst.fs.delete(dst.root, true)
      // A rescale's directory, no journal and no offset log (publishing copies it): the output of
      // a rescale that died writing or replacing its journal, before publishing; no query ran on it.
      case None if dst.fs.exists(new Path(dst.root, RescaleDir)) && !dst.fs.exists(new Path(dst.root, "offsets")) =>
        progress(s"dropping the unpublished output of an interrupted rescale at ${dst.root}")
        dst.fs.delete(dst.root, true)
      // A savepoint's restore at another count rescales into the folder it marks as unfinished.
      case _ if dst.fs.listStatus(dst.root).exists(f => !restoring || f.getPath.getName != RestoreMapping.UnfinishedMarker) =>
        throw KeyedStateErrors.badArgument(ErrorId.RescaleRefused,
          s"The rescale output ${dst.root} already exists and is not empty; give a new path")
      case _ => ()
    }
  }

  /** A query of this application on the checkpoint is running: refuse (others: see the batch check). */
  private def checkNotRunning(src: QueryCheckpoint): Unit =
    src.runningQueries(spark).headOption.foreach { q =>
      throw KeyedStateErrors.badState(ErrorId.RescaleRefused,
        s"The query '${Option(q.name).getOrElse(q.id)}' (id ${q.id}) is running on ${src.root}; stop it, then rescale")
    }

  /**
   * A fresh lease on any source partition whose query runs: another application's (it refreshed
   * the lease lately), or one of this application's that Spark's coordinator still knows as
   * active (a query of another session: a stopped query's leases linger until its providers
   * unload).
   */
  private def checkNoLeases(src: QueryCheckpoint, stores: Seq[(Int, String)], from: Int): Unit = {
    val self = spark.sparkContext.applicationId
    for ((op, store) <- stores; p <- 0 until from) {
      val ref = StoreRef(op, store, p)
      StoreLease.fresh(src.storeDir(ref), hadoopConf).filter { case (h, _) =>
        h.applicationId != self || activeHere(src, ref, h)
      }.foreach { case (h, age) =>
        val expiresInS = math.max(0L, StoreLease.StaleAfterMs - age) / 1000
        val expiresAt = java.time.Instant.ofEpochMilli(System.currentTimeMillis() - age + StoreLease.StaleAfterMs)
          .truncatedTo(java.time.temporal.ChronoUnit.SECONDS)
        throw KeyedStateErrors.badState(ErrorId.RescaleRefused,
          s"${ref.describe} of ${src.root} is in use by application ${h.applicationId} (query run ${h.queryRunId}, " +
            s"executor ${h.executorId} on ${h.host}): its lease ${StoreLease.path(src.storeDir(ref))} was refreshed " +
            s"${age / 1000} s ago, so the query is running. Stop it, then rescale (a stopped query releases its " +
            s"leases). A lease left by a killed driver or executor expires ${StoreLease.StaleAfterMs / 60000} " +
            s"minutes after its last refresh: this one in $expiresInS s ($expiresAt), unless refreshed.")
      }
    }
  }

  private def activeHere(src: QueryCheckpoint, ref: StoreRef, h: LeaseHolder): Boolean =
    scala.util.Try(java.util.UUID.fromString(h.queryRunId)).toOption.exists { run =>
      val id = StateStoreId(src.stateRoot.toString, ref.operatorId, ref.partition, ref.storeName)
      KeyedStateCoordinatorBridge.isActive(StateStoreProviderId(id, run), h.executorId)
    }

  private def lastCommittedBatch(src: QueryCheckpoint): Long = {
    val offsets = src.lastBatch("offsets").getOrElse(throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid,
      s"${src.root} has no batch in its offset log: there is no state to rescale"))
    if (!src.batches("commits").contains(offsets)) {
      throw KeyedStateErrors.badState(ErrorId.RescaleRefused,
        s"Batch $offsets of ${src.root} is planned (${src.offsetPath(offsets)}) but not committed: the query is " +
          "running, or stopped in the middle of a batch. Stop it, or restart it and let it finish a batch, then rescale.")
    }
    offsets
  }

  /** (operator, store name) pairs, after checking every source partition has the version. */
  private def discoverStores(src: QueryCheckpoint, from: Int, version: Long): Seq[(Int, String)] = {
    val stores = src.operators.flatMap(op => src.storeNames(op, 0).map(op -> _))
    if (stores.isEmpty) throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid, s"${src.root} has no state to rescale")
    for ((op, store) <- stores; p <- 0 until from) {
      val ref = StoreRef(op, store, p)
      val manifest = new Path(src.storeDir(ref), s"$version.manifest")
      if (!src.fs.exists(manifest)) {
        val foreign = src.foreignStateFiles(ref)
        throw KeyedStateErrors.badState(ErrorId.RescaleRefused,
          if (foreign.nonEmpty) {
            s"${ref.describe} of ${src.root} holds files of another state store provider (${foreign.take(3).mkString(", ")}); " +
              "keyedstate rescale reads only keyedstate state"
          } else s"State version $version of ${ref.describe} is missing: $manifest does not exist")
      }
    }
    stores
  }

  private def publishCopy(src: QueryCheckpoint, dst: QueryCheckpoint, j: RescaleJournal): Unit = {
    progress("writing the query metadata")
    new CheckpointWriter(spark, dst, j.batchId, j.toPartitions).copyMetadata(src, src.metadataFiles())
    deleteOrFail(dst.fs, new Path(dst.root, RescaleDir))
  }

  /**
   * Moves the staged manifests over the live ones, retires partitions the new count does not
   * have, and pins the new count. Every step can be repeated: an interrupted publish is redone.
   */
  private def publishInPlace(src: QueryCheckpoint, j: RescaleJournal): Unit = {
    progress("publishing the rescaled state in place")
    val staging = new Path(new Path(src.root, RescaleDir), "staging")
    for (op <- src.operators; store <- src.storeNames(op, 0); t <- 0 until j.toPartitions) {
      val staged = new Path(staging, s"manifests/$op/$store/$t/${j.batchId + 1}.manifest")
      if (src.fs.exists(staged)) {
        val live = new Path(src.storeDir(StoreRef(op, store, t)), s"${j.batchId + 1}.manifest")
        if (!org.apache.hadoop.fs.FileUtil.copy(src.fs, staged, src.fs, live, false, true, hadoopConf)) {
          throw KeyedStateErrors.checkpointWrite(s"The file system did not copy $staged over $live; run the rescale again")
        }
      }
    }
    for (op <- src.operators; p <- src.partitions(op) if p >= j.toPartitions) {
      deleteOrFail(src.fs, new Path(src.stateRoot, s"$op/$p"))
    }
    pinPartitionsInPlace(src, j)
    deleteOrFail(src.fs, new Path(src.root, RescaleDir))
  }

  /** Publishing steps are repeatable: one the file system refused fails the publish, to be redone. */
  private def deleteOrFail(fs: org.apache.hadoop.fs.FileSystem, path: Path): Unit =
    if (!fs.delete(path, true) && fs.exists(path)) {
      throw KeyedStateErrors.checkpointWrite(s"The file system did not delete $path; run the rescale again")
    }

  /**
   * A rescale directory without a journal is what a rescale left that died before its journal
   * was written, or while the journal was replaced (on most file systems a rename over an
   * existing file deletes it first): it never published, so nothing in it is needed, and its
   * staged files would collide with this run's.
   */
  private def dropUnjournaled(ckpt: QueryCheckpoint): Unit = {
    val dir = new Path(ckpt.root, RescaleDir)
    if (ckpt.fs.exists(dir) && RescaleJournal.read(ckpt.root, hadoopConf).isEmpty) {
      progress(s"dropping $dir, left without a journal by an interrupted rescale")
      deleteOrFail(ckpt.fs, dir)
    }
  }

  private def undoInPlace(src: QueryCheckpoint): Unit =
    src.fs.delete(new Path(src.root, RescaleDir), true)

  /**
   * In place, Spark's own files are overwritten, and an overwrite interrupted half-way leaves a
   * truncated file. So their new contents are first staged whole (a marker file says when all
   * are), and the live files are then overwritten from the staged copies: a publish interrupted
   * at any point is redone from them, never from a half-written live file.
   */
  private def pinPartitionsInPlace(src: QueryCheckpoint, j: RescaleJournal): Unit = {
    val staged = new Path(new Path(src.root, RescaleDir), "staging/pinned")
    val complete = new Path(staged, "_complete")
    val files = CheckpointWriter.pinnedFiles(src, j.batchId)
    if (!src.fs.exists(complete)) {
      // No live file was overwritten yet: their contents are the source's.
      if (!src.fs.delete(staged, true) && src.fs.exists(staged)) {
        throw KeyedStateErrors.checkpointWrite(s"The file system did not delete $staged; run the rescale again")
      }
      files.foreach(relative => src.writeFile(new Path(staged, relative), CheckpointWriter.pinnedText(src, relative, j.toPartitions)))
      src.writeFile(complete, files.mkString("\n"))
    }
    files.foreach { relative =>
      val from = new Path(staged, relative)
      val live = new Path(src.root, relative)
      if (!org.apache.hadoop.fs.FileUtil.copy(src.fs, from, src.fs, live, false, true, hadoopConf)) {
        throw KeyedStateErrors.checkpointWrite(s"The file system did not copy $from over $live; run the rescale again")
      }
    }
  }

  private def runTasks[T: scala.reflect.ClassTag, R: scala.reflect.ClassTag](phase: String, tasks: Seq[T])(
      f: (T, Map[String, String], KeyedStateConf) => R): Seq[R] =
    OfflineJob.run(spark, "rescale", phase, tasks, OfflineJob.hadoopSettings(hadoopConf), conf, progress)(f)
}

object Rescaler {
  val MaxPartitions = 100000

  private implicit val formats: Formats = DefaultFormats

  /** The entry point of the Python package and the CLI: the result as JSON. */
  def rescale(spark: SparkSession, source: String, partitions: Int, output: String, inPlace: Boolean): String = {
    val result = new Rescaler(spark, Progress.of("rescale"))
      .run(source, partitions, Option(output).filter(_.nonEmpty), inPlace)
    Serialization.write(result)
  }
}
