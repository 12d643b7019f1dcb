package io.keyedstate.offline

import java.nio.charset.StandardCharsets.UTF_8

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, FileUtil, Path}
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.apache.spark.sql.internal.SQLConf
import org.json4s._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import io.keyedstate.KeyedStateStoreProvider
import io.keyedstate.checkpoint.{CheckpointStore, OffsetLog, RescaleJournal}
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.shims.SparkTypes.StreamingQueryWrapper

/** One state store partition directory of a checkpoint. */
final case class StoreRef(operatorId: Int, storeName: String, partition: Int) {
  def describe: String =
    if (storeName == StateStoreId.DEFAULT_STORE_NAME) s"state/$operatorId/$partition"
    else s"state/$operatorId/$partition/$storeName"
}

/**
 * A streaming query's checkpoint as Spark lays it out: the offset and commit logs, the query
 * metadata and the state directories (`state/<operator>/<partition>[/<store>]`). Reads go through
 * the Hadoop FileSystem of the checkpoint, and so do writes (on the local file system that keeps
 * Hadoop's `.crc` side files consistent with the files Spark reads back).
 */
final class QueryCheckpoint(val root: Path, val hadoopConf: Configuration) {
  val fs: FileSystem = root.getFileSystem(hadoopConf)
  val stateRoot = new Path(root, "state")

  def exists: Boolean = fs.exists(root)

  /** The queries of `spark`'s application that run on this checkpoint (a tool refuses or yields to them). */
  def runningQueries(spark: SparkSession): Seq[StreamingQueryWrapper] =
    spark.streams.active.toSeq.collect {
      case q: StreamingQueryWrapper if QueryCheckpoint.qualify(q.streamingQuery.resolvedCheckpointRoot, hadoopConf) == root => q
    }

  /** Refuses a location with no checkpoint, in the words every tool uses. */
  def requireExists(): Unit =
    if (!exists) throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"no checkpoint at $root")

  /** The last batch of the commit log, or a refusal every tool words the same way. */
  def lastCommit(): Long = {
    requireExists()
    lastBatch("commits").getOrElse(throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
      s"$root has no committed batch (no file in $root/commits)"))
  }

  /** The batch ids with an entry in `offsets` or `commits`. */
  def batches(log: String): Seq[Long] = OffsetLog.batches(fs, root, log)

  def lastBatch(log: String): Option[Long] = batches(log).lastOption

  private def listNames(dir: Path): Seq[String] = OffsetLog.listNames(fs, dir)

  def readLines(path: Path): Seq[String] = {
    val in = fs.open(path)
    try new String(in.readAllBytes(), UTF_8).split("\n", -1).toSeq finally in.close()
  }

  /** `overwrite` false: the file must be new (a second writer fails). */
  def writeFile(path: Path, text: String, overwrite: Boolean = true): Unit = {
    val out = fs.create(path, overwrite)
    try out.write(text.getBytes(UTF_8)) finally out.close()
  }

  def offsetPath(batch: Long): Path = new Path(root, s"offsets/$batch")
  def commitPath(batch: Long): Path = new Path(root, s"commits/$batch")

  /** The session configuration Spark pinned in the offset log entry of `batch`. */
  def pinnedConf(batch: Long): Map[String, String] = OffsetLog.pinnedConf(fs, root, batch)

  /** The offset log entry of `batch` with one pinned setting changed, everything else kept. */
  def withPinnedConf(batch: Long, key: String, value: String): String = {
    val lines = readLines(offsetPath(batch))
    if (lines.size < 2) throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid, s"Offset log entry ${offsetPath(batch)} is truncated")
    val updated = parse(lines(1)).transformField {
      case ("conf", JObject(fields)) =>
        ("conf", JObject(fields.filterNot(_._1 == key) :+ (key -> JString(value))))
    }
    lines.updated(1, compact(render(updated))).mkString("\n")
  }

  /**
   * The commit log entry of `batch` without its state checkpoint ids: what a savepoint keeps, so
   * that the store versions it holds load by version alone (`<version>.manifest`) whatever
   * format the restored query runs with (under format v2 Spark loads a version its last commit
   * records no id for by version, and records ids again from its next commit). None: it has none.
   */
  def commitWithoutCheckpointIds(batch: Long): Option[String] = {
    val lines = readLines(commitPath(batch))
    if (lines.size < 2 || !hasIds(parse(lines(1)) \ "stateUniqueIds")) None
    else Some(lines.updated(1, compact(render(parse(lines(1)).removeField(_._1 == "stateUniqueIds")))).mkString("\n"))
  }

  /** The commit log entry of `batch`'s `stateUniqueIds` (checkpoint format v2), or JNothing. */
  private def stateUniqueIds(batch: Long): JValue = {
    val lines = readLines(commitPath(batch))
    if (lines.size < 2) JNothing else parse(lines(1)) \ "stateUniqueIds"
  }

  private def hasIds(all: JValue): Boolean = all match {
    case JObject(fields) => fields.nonEmpty
    case _ => false
  }

  /** Whether the commit log entry of `batch` carries state checkpoint ids (checkpoint format v2). */
  def usesCheckpointIds(batch: Long): Boolean = hasIds(stateUniqueIds(batch))

  /**
   * The state checkpoint ids (checkpoint format v2) that the commit log entry of `batch` records
   * for `operatorId`: per partition (the index), one per store in Spark's order (a single one for
   * the default store); None if it records none for the operator.
   */
  def checkpointIds(batch: Long, operatorId: Int): Option[IndexedSeq[Seq[String]]] =
    idsOf(stateUniqueIds(batch), batch, operatorId)

  private def idsOf(all: JValue, batch: Long, operatorId: Int): Option[IndexedSeq[Seq[String]]] =
    all \ operatorId.toString match {
      case JArray(partitions) => Some(partitions.zipWithIndex.map {
        case (JArray(stores), partition) if stores.nonEmpty => stores.map {
          case JString(id) => id
          case other => throw noCheckpointId(batch, operatorId, partition, other)
        }
        case (other, partition) => throw noCheckpointId(batch, operatorId, partition, other)
      }.toIndexedSeq)
      case _ => None
    }

  /**
   * The checkpoint id of the default store of each of `partitions` of `operatorId` at `batch`
   * (empty with checkpoint format v1), for the tools that load one version of a query's state.
   */
  def defaultStoreCheckpointIds(batch: Long, operatorId: Int, partitions: Seq[Int]): Map[Int, String] = {
    val all = stateUniqueIds(batch)
    idsOf(all, batch, operatorId) match {
      case Some(recorded) =>
        partitions.map { p =>
          p -> recorded.lift(p).map(_.head).getOrElse(throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid,
            s"${commitPath(batch)} records state checkpoint ids for ${recorded.size} partitions of operator " +
              s"$operatorId, and the state has partition $p"))
        }.toMap
      case None if hasIds(all) =>
        throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid,
          s"${commitPath(batch)} records state checkpoint ids (checkpoint format v2), none for operator $operatorId")
      case None => Map.empty
    }
  }

  private def noCheckpointId(batch: Long, operatorId: Int, partition: Int, found: JValue): Exception =
    KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid,
      s"${commitPath(batch)} records no state checkpoint id for operator $operatorId, partition $partition " +
        s"(found ${compact(render(found))})")

  def operators: Seq[Int] = listNames(stateRoot).flatMap(_.toIntOption).sorted

  /**
   * Spark's operator metadata files of `op`, relative to the root: `_metadata/metadata` (version 1)
   * and `_metadata/v2/<batch>` (version 2, which keyed functions write for their properties).
   */
  def operatorMetadataFiles(op: Int): Seq[String] = {
    val v1 = s"state/$op/_metadata/metadata"
    (if (fs.exists(new Path(root, v1))) Seq(v1) else Nil) ++
      listNames(new Path(root, s"state/$op/_metadata/v2")).filter(_.forall(_.isDigit)).sortBy(_.toLong)
        .map(b => s"state/$op/_metadata/v2/$b")
  }

  /** Spark's name of operator `op` (`stateStoreSave`, `keyedProcess`, ...), from its newest metadata; "" if none. */
  def operatorName(op: Int): String =
    operatorMetadataFiles(op).lastOption.flatMap { relative =>
      "\"operatorName\":\"([^\"]*)\"".r.findFirstMatchIn(readLines(new Path(root, relative)).mkString).map(_.group(1))
    }.getOrElse("")

  /** The store names of operator `op` as Spark's newest operator metadata lists them (empty: none listed). */
  def operatorStoreNames(op: Int): Seq[String] =
    operatorMetadataFiles(op).lastOption.toSeq.flatMap { relative =>
      val json = parse(readLines(new Path(root, relative)).drop(1).mkString("\n"))
      (json \ "stateStoreInfo").children.flatMap(s => (s \ "storeName") match {
        case JString(name) => Some(name)
        case _ => None
      })
    }

  def partitions(operatorId: Int): Seq[Int] =
    listNames(new Path(stateRoot, operatorId.toString)).flatMap(_.toIntOption).sorted

  def storeDir(store: StoreRef): Path =
    new Path(StateStoreId(stateRoot.toString, store.operatorId, store.partition, store.storeName)
      .storeCheckpointLocation().toString)

  /**
   * The stores of an operator, found in its partition directories: the default store keeps its
   * manifests in the partition directory itself, named stores (stream-stream joins) in
   * sub-directories. Other files (Spark's schema and metadata files) are not stores.
   */
  def storeNames(operatorId: Int, partition: Int): Seq[String] = {
    val dir = new Path(stateRoot, s"$operatorId/$partition")
    if (!fs.exists(dir)) return Nil
    val entries = fs.listStatus(dir).toSeq
    val default =
      if (entries.exists(st => st.isFile && CheckpointStore.parseManifestName(st.getPath.getName).isDefined)) {
        Seq(StateStoreId.DEFAULT_STORE_NAME)
      } else Nil
    val named = entries.filter(_.isDirectory).map(_.getPath.getName)
      .filterNot(n => QueryCheckpoint.StoreInternalDirs.contains(n) || n.startsWith("_") || n.startsWith("."))
    default ++ named.sorted
  }

  /** Files of the store directory that are not keyedstate's own (other providers' files). */
  def foreignStateFiles(store: StoreRef): Seq[String] = {
    val dir = storeDir(store)
    if (!fs.exists(dir)) Nil
    else fs.listStatus(dir).toSeq.filter(_.isFile).map(_.getPath.getName)
      .filterNot(n => n.startsWith(".") || n.endsWith(".manifest") || n.endsWith(".snapshot"))
  }

  /**
   * Every file that is query metadata rather than keyedstate state data, relative to the root:
   * the logs, `metadata`, `sources/`, and Spark's schema and operator metadata files under
   * `state/`. A rescaled copy starts from these.
   */
  def metadataFiles(): Seq[String] = {
    val out = Seq.newBuilder[String]
    def walk(dir: Path, rel: String, underState: Boolean): Unit = fs.listStatus(dir).foreach { st =>
      val name = st.getPath.getName
      val path = if (rel.isEmpty) name else s"$rel/$name"
      if (name.startsWith(".")) () // .crc side files, temporary files, the rescale journal
      else if (rel.isEmpty && name.startsWith("_")) () // keyedstate's own at the root (a savepoint's metadata)
      else if (st.isDirectory) {
        if (!(underState && QueryCheckpoint.StoreInternalDirs.contains(name))) walk(st.getPath, path, underState || path == "state")
      } else if (!(underState && (name.endsWith(".manifest") || name.endsWith(".snapshot")))) out += path
    }
    if (fs.exists(root)) walk(root, "", underState = false)
    out.result()
  }

  /** Refuses a checkpoint whose state another provider wrote (the offset log entry of `batch` says). */
  def requireKeyedStateProvider(batch: Long, operation: String): Unit = {
    val provider = pinnedConf(batch).getOrElse(QueryCheckpoint.ProviderKey, QueryCheckpoint.SparkDefaultProvider)
    if (provider != QueryCheckpoint.OurProvider) {
      val hint =
        if (provider.endsWith("RocksDBStateStoreProvider")) {
          " (for Spark's RocksDB provider, Spark 4.2+ has spark._streamingCheckpointManager.repartition)"
        } else ""
      throw KeyedStateErrors.unsupported(ErrorId.QueryCheckpointInvalid,
        s"The state of $root is written by $provider (${offsetPath(batch)}); keyedstate $operation reads " +
          s"only ${QueryCheckpoint.OurProvider} state$hint")
    }
  }

  /** Copies a file of this checkpoint to the same place under `target` (checksums rewritten). */
  def copyTo(relative: String, target: QueryCheckpoint): Unit =
    FileUtil.copy(fs, new Path(root, relative), target.fs, new Path(target.root, relative), false, true, hadoopConf)
}

object QueryCheckpoint {
  /** The Hadoop configuration a session's jobs see: the context's, with the session's settings. */
  def hadoopConf(spark: org.apache.spark.sql.SparkSession): Configuration = {
    val c = new Configuration(spark.sparkContext.hadoopConfiguration)
    spark.conf.getAll.foreach { case (k, v) => c.set(k, v) }
    c
  }

  /** The checkpoint at `location`, its path fully qualified (so paths compare equal). */
  def at(location: String, hadoopConf: Configuration): QueryCheckpoint =
    new QueryCheckpoint(qualify(location, hadoopConf), hadoopConf)

  def qualify(location: String, hadoopConf: Configuration): Path = {
    val p = new Path(location)
    p.getFileSystem(hadoopConf).makeQualified(p)
  }

  /** keyedstate's own directories inside a store directory. */
  val StoreInternalDirs: Set[String] =
    Set(CheckpointStore.SharedDir, CheckpointStore.PrivateDir, CheckpointStore.ChangelogDir)

  /** Where a rescale keeps its journal and staging files, under the checkpoint root. */
  val RescaleDir: String = RescaleJournal.Dir

  val ProviderKey: String = SQLConf.STATE_STORE_PROVIDER_CLASS.key
  val PartitionsKey: String = SQLConf.SHUFFLE_PARTITIONS.key
  val OurProvider: String = classOf[KeyedStateStoreProvider].getName
  val SparkDefaultProvider = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider" // private[sql]
}
