package io.keyedstate.engine

import java.nio.charset.StandardCharsets.UTF_8
import java.util.UUID

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types.StructType
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.{JsonMethods, Serialization}

import io.keyedstate.TaskStateStore
import io.keyedstate.checkpoint.{BootstrappedState, CheckpointStore}
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.shims.SparkShims

/** A keyed function of the savepoint a checkpoint was restored from: its operator id there. */
final case class SavedFunction(operatorId: Int, uid: Option[String], function: String, states: Seq[String]) {
  def describe: String = function + uid.fold("")(u => s" (uid '$u')")
}

/**
 * What a restore leaves for the query's first batch (`_keyedstate_restore.json` at the
 * checkpoint's root): the savepoint's keyed functions under their operator ids there, whether
 * state the restored query no longer has may be dropped, and the partition count its state was
 * written for. `batchId` -1: a bootstrapped savepoint, whose state is version 0, the state a new
 * query's first batch starts from.
 */
final case class PendingRestore(batchId: Long, allowNonRestoredState: Boolean, functions: Seq[SavedFunction],
    partitions: Int) {
  def bootstrapped: Boolean = batchId < 0
}

/**
 * Maps a restored savepoint's keyed-function state to the query that runs on it, as Flink maps
 * a savepoint's state to operators by uid: when the first batch of a run is planned on the
 * driver, before Spark checks the checkpoint's operators against the plan. Keyed functions'
 * operator ids follow the order the query applies them; a function is the savepoint's function
 * with its uid (without a uid: the one at its operator id, of the same class). Its state moves to
 * its new id; a new function starts empty (a version at the savepoint's batch, declared); a
 * savepoint's function or state the query no longer has is refused unless the restore allowed
 * non-restored state, and then dropped. Every step can be redone: a driver that dies half-way
 * leaves the pending file, and the next start finishes the mapping.
 */
object RestoreMapping {
  val FileName = "_keyedstate_restore.json"
  /**
   * In a checkpoint a restore is writing, from its first write to its last: a restore killed
   * mid-way leaves it, no query starts there, and the next restore into the folder replaces it.
   */
  val UnfinishedMarker = ".keyedstate-restore-unfinished"
  private val Staging = "_keyedstate_restore"

  private implicit val formats: Formats = DefaultFormats

  def write(root: Path, hadoopConf: Configuration, pending: PendingRestore): Unit = {
    val fs = root.getFileSystem(hadoopConf)
    val out = fs.create(new Path(root, FileName), true)
    try out.write(Serialization.writePretty(pending).getBytes(UTF_8)) finally out.close()
  }

  private def read(fs: FileSystem, file: Path): PendingRestore = {
    val text = readText(fs, file)
    try Serialization.read[PendingRestore](text)
    catch { case NonFatal(e) => throw KeyedStateErrors.fileCorrupt(s"$file is corrupt: ${e.getMessage}", e) }
  }

  /**
   * Maps the pending restore of the checkpoint whose state root is `stateRoot`, if any, to the
   * keyed functions `now` (in application order, with their input schemas).
   */
  def applyIfPending(session: SparkSession, stateRoot: String, numPartitions: Int,
      now: Seq[(ProcessSpec, StructType)]): Unit = synchronized {
    val hadoopConf = session.sessionState.newHadoopConf()
    val checkpointState = new Path(stateRoot)
    val fs = checkpointState.getFileSystem(hadoopConf)
    val file = new Path(checkpointState.getParent, FileName)
    if (!fs.exists(file)) return
    val pending = read(fs, file)
    // Bootstrapped state waits beside the state folder until the first batch adopts it.
    val state = if (pending.bootstrapped) BootstrappedState.stateRoot(checkpointState.getParent) else checkpointState
    val ids = now.indices.map(KeyedProcessOperators.FirstOperatorId + _)
    val matched: Map[Int, SavedFunction] = ids.zip(now).flatMap { case (id, (spec, _)) =>
      val saved = spec.uid match {
        case Some(u) => pending.functions.find(_.uid.contains(u))
        case None => pending.functions.find(f => f.uid.isEmpty && f.operatorId == id && f.function == spec.functionName)
      }
      saved.map(id -> _)
    }.toMap
    val dropped = pending.functions.filterNot(f => matched.values.exists(_ eq f))
    val removedStates = ids.zip(now).flatMap { case (id, (spec, _)) =>
      matched.get(id).toSeq.flatMap(_.states.filterNot(s => spec.states.exists(_.name == s)).map(s => (matched(id), s)))
    }
    if (!pending.allowNonRestoredState) {
      dropped.headOption.foreach { f =>
        throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionStateNotRestored, s"the savepoint restored into " +
          s"${checkpointState.getParent} holds the state of keyed function ${f.describe} (operator ${f.operatorId} there), " +
          s"and the query has no keyed function ${f.uid.fold(s"of class ${f.function} at operator ${f.operatorId}")(u => s"with uid '$u'")}; " +
          "restore with allow_non_restored_state=True (--allow-non-restored-state) to drop its state")
      }
      removedStates.headOption.foreach { case (f, s) =>
        throw KeyedStateErrors.badArgument(ErrorId.KeyedFunctionStateNotRestored, s"state '$s' of keyed function " +
          s"${f.describe} is in the savepoint restored into ${checkpointState.getParent}, and the function no longer declares " +
          "it; restore with allow_non_restored_state=True (--allow-non-restored-state) to leave it unread")
      }
    }
    // Every directory that moves or goes is staged first, so that a new id may be an old one.
    val staging = new Path(state, Staging)
    val moves = matched.toSeq.collect { case (id, f) if id != f.operatorId => f.operatorId -> id }
    (moves.map(_._1) ++ dropped.map(_.operatorId)).foreach { old =>
      val from = new Path(state, old.toString)
      if (fs.exists(from) && !fs.exists(new Path(staging, old.toString))) {
        fs.mkdirs(staging)
        rename(fs, from, new Path(staging, old.toString))
      }
    }
    moves.foreach { case (old, id) =>
      val staged = new Path(staging, old.toString)
      if (fs.exists(staged)) {
        rename(fs, staged, new Path(state, id.toString))
        renumberMetadata(fs, new Path(state, id.toString), old, id)
      }
    }
    if (fs.exists(staging) && !fs.delete(staging, true)) {
      throw KeyedStateErrors.checkpointWrite(s"The file system did not delete $staging; start the query again")
    }
    // Bootstrapped state is version 0: a new function's version 0 is empty without any file.
    if (!pending.bootstrapped) ids.zip(now).filterNot(x => matched.contains(x._1)).foreach { case (id, (spec, input)) =>
      startEmpty(session, hadoopConf, stateRoot, id, numPartitions, pending.batchId, spec, input)
    }
    if (!fs.delete(file, false) && fs.exists(file)) {
      throw KeyedStateErrors.checkpointWrite(s"The file system did not delete $file; start the query again")
    }
  }

  /**
   * When a streaming query starts on `checkpointRoot` (on the driver, before its first batch): a
   * bootstrapped checkpoint's state was written for one partition count, and a new query takes
   * its count from the session, not from the checkpoint: another count would read every key
   * from the wrong partition, so it is refused. A bootstrap's pending file left by a query that
   * has committed batches (and ran no keyed function to map) is dropped.
   */
  def checkAtStart(session: SparkSession, checkpointRoot: String): Unit = {
    val hadoopConf = session.sessionState.newHadoopConf()
    val root = new Path(checkpointRoot)
    val fs = root.getFileSystem(hadoopConf)
    val unfinished = new Path(root, UnfinishedMarker)
    if (fs.exists(unfinished)) {
      throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid, s"$root holds an unfinished restore of the " +
        s"savepoint ${readText(fs, unfinished).trim} ($unfinished): run the restore again, which replaces it")
    }
    val file = new Path(root, FileName)
    if (!fs.exists(file)) return
    val pending = read(fs, file)
    if (!pending.bootstrapped) return
    val commits = new Path(root, "commits")
    val committed = fs.exists(commits) && fs.listStatus(commits).exists(s => s.getPath.getName.forall(_.isDigit))
    if (committed) {
      // Every store adopted its bootstrapped version with the first commit.
      fs.delete(new Path(root, BootstrappedState.Dir), true)
      fs.delete(file, false)
    }
    else {
      val partitions = session.sessionState.conf.numShufflePartitions
      if (partitions != pending.partitions) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"the state bootstrapped into $root " +
          s"is written for ${pending.partitions} partitions and the query would run with $partitions " +
          s"(spark.sql.shuffle.partitions): every key would be read from the wrong partition. Set " +
          s"spark.sql.shuffle.partitions=${pending.partitions}, or restore the bootstrapped savepoint again with " +
          s"partitions=$partitions")
      }
    }
  }

  private def readText(fs: FileSystem, file: Path): String =
    CheckpointStore.readText(fs, file)(e => KeyedStateErrors.fileMissing(s"$file is missing", e))

  private def rename(fs: FileSystem, from: Path, to: Path): Unit =
    if (!fs.rename(from, to)) {
      throw KeyedStateErrors.checkpointWrite(s"The file system did not rename $from to $to; start the query again")
    }

  /** Spark's operator metadata under an operator's directory names the operator's id. */
  private def renumberMetadata(fs: FileSystem, dir: Path, old: Int, id: Int): Unit = {
    val metadata = new Path(dir, "_metadata")
    if (fs.exists(metadata)) {
      val files = fs.listFiles(metadata, true)
      while (files.hasNext) {
        val f = files.next().getPath
        if (!f.getName.startsWith(".")) {
          val in = fs.open(f)
          val text = try new String(in.readAllBytes(), UTF_8) finally in.close()
          val renumbered = text.replace(s""""operatorId":$old""", s""""operatorId":$id""")
          if (renumbered != text) {
            val out = fs.create(f, true)
            try out.write(renumbered.getBytes(UTF_8)) finally out.close()
          }
        }
      }
    }
  }

  /**
   * A keyed function new in the restored query: an empty, declared version at the savepoint's
   * batch in every partition, and Spark's operator metadata for it, as if it had run all along.
   */
  private def startEmpty(session: SparkSession, hadoopConf: Configuration, stateRoot: String, id: Int,
      numPartitions: Int, batch: Long, spec: ProcessSpec, input: StructType): Unit = {
    val layout = new StateLayout(spec, input)
    val declaration = OperatorDeclaration.of(spec, input)
    // Named by version alone (format v1), as the restored batch's commit records no ids.
    val v1 = KeyedProcessSqlBridge.sqlConfWith(session, Map(SQLConf.STATE_STORE_CHECKPOINT_FORMAT_VERSION.key -> "1"))
    val storeConf = new StateStoreConf(v1, StoreOptions.ttlOptions(spec.states, id))
    (0 until numPartitions).foreach { p =>
      val providerId = StateStoreProviderId(StateStoreId(stateRoot, id, p), UUID.randomUUID())
      val provider = StateStoreProvider.createAndInit(providerId, layout.keySchema, layout.defaultValueSchema,
        NoPrefixKeyStateEncoderSpec(layout.keySchema), useColumnFamilies = true, storeConf, hadoopConf,
        useMultipleValuesPerKey = true, None)
      try {
        val store = SparkShims.getStore(provider, batch, None, forceSnapshotOnCommit = true, loadEmpty = true)
        try {
          store.asInstanceOf[TaskStateStore].declare(declaration.toJson)
          store.commit()
        } finally if (!store.hasCommitted) store.abort()
      } finally provider.close()
    }
    val metadata = OperatorStateMetadataV2(OperatorInfoV1(id, KeyedProcessOperators.ShortName),
      Array(StateStoreMetadataV2(StateStoreId.DEFAULT_STORE_NAME, 0, numPartitions, Nil)),
      JsonMethods.compact(declaration.toJson))
    new OperatorStateMetadataV2Writer(new Path(stateRoot, id.toString), hadoopConf, batch).write(metadata)
  }
}
