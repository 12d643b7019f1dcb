package io.keyedstate.offline

import java.util.UUID

import org.apache.hadoop.fs.Path
import org.apache.spark.Partitioner
import org.apache.spark.rdd.ShuffledRDD
import org.apache.spark.serializer.KryoSerializer
import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters
import org.apache.spark.sql.catalyst.util.{ArrayData, MapData}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types._
import org.apache.spark.util.SerializableConfiguration
import org.json4s.{JArray, JField, JString}
import org.json4s.jackson.JsonMethods

import io.keyedstate.{TaskStateStore, KeyedStateStoreProvider}
import io.keyedstate.checkpoint.{BootstrappedState, CheckpointStore}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.engine.{OperatorLists, StateKind}
import io.keyedstate.rocks.{KeyGroupHasher, KeyGroups}
import io.keyedstate.shims.{SparkShims, StoreApi}

/**
 * The writer of a new query checkpoint at one committed batch B, the counterpart of
 * [[StateReader]]: the query's logs and Spark's metadata files copied from a source with the
 * partition count pinned, and each store partition's version B+1 written through the state store
 * provider itself (a store opened empty at B, filled, committed), so the state is exactly what
 * the provider would have written. Tables come in the reader's unflattened form (a list or a map
 * per key); each row goes to the partition Spark's hash partitioning gives its key at the new
 * count. Restoring a canonical savepoint, bootstrapping and transforming state are built on it.
 * `batch` -1 writes bootstrapped state: version 0, which a new query's first batch starts from
 * (keyedstate's provider only; the others' version 0 is always empty), see `BootstrappedState`.
 */
final class CheckpointWriter(spark: SparkSession, val target: QueryCheckpoint, val batch: Long, val partitions: Int) {

  /** Copies `files` (relative: the logs and Spark's metadata of `src`), pinning the partition count. */
  def copyMetadata(src: QueryCheckpoint, files: Seq[String]): Unit = {
    files.filterNot(CheckpointWriter.isRetiredPartitionFile(_, partitions)).foreach(src.copyTo(_, target))
    CheckpointWriter.pinnedFiles(target, batch).foreach { relative =>
      target.writeFile(new Path(target.root, relative), CheckpointWriter.pinnedText(target, relative, partitions))
    }
  }

  /**
   * Writes version `batch + 1` of every partition of one store of operator `op` from `tables`
   * (each the reader's unflattened rows of one table of that store), with `declaration` (a
   * keyed function's) in every manifest. Returns the rows written per table (a map's row one
   * entry per map key, operator lists joined per partition: rows, not entries, are counted).
   */
  def writeStore(op: Int, storeName: String, tables: Seq[(StateTable, DataFrame)],
      declaration: Option[String], settings: Map[String, String], fromPartitions: Int): Seq[Long] = {
    require(tables.nonEmpty && tables.forall(t => t._1.operatorId == op && t._1.storeName == storeName))
    val pinned = if (batch < 0) Map.empty[String, String] else target.pinnedConf(batch)
    // Each written version is a full snapshot, committed with it: the restored query loads
    // files, replays nothing, and bootstrapped state can be published as version 0. It is named
    // by version alone (format v1), as the commits a savepoint holds record no ids.
    val snapshots = Map(KeyedStateConf.Prefix + "changelogCheckpointing" -> "false",
      SQLConf.STATE_STORE_CHECKPOINT_FORMAT_VERSION.key -> "1")
    val conf = KeyedProcessSqlBridge.sqlConfWith(spark, pinned ++ settings ++ snapshots)
    val storeConf = new StateStoreConf(conf, tables.flatMap(_._1.ttlOptions).toMap)
    // As writePartition opens its stores: refused here, before any partition is written.
    if (storeConf.providerClass != QueryCheckpoint.SparkDefaultProvider) {
      val provider = Class.forName(storeConf.providerClass, false, Thread.currentThread.getContextClassLoader)
      SparkShims.checkOpensEmpty(provider, math.max(batch, 0))
    }
    val hadoopConf = new SerializableConfiguration(target.hadoopConf)
    // Bootstrapped state waits beside `state`, which a new query must find empty.
    val stateRoot = (if (batch < 0) BootstrappedState.stateRoot(target.root) else target.stateRoot).toString
    val specs = tables.map(_._1)
    val n = partitions
    val isOperatorState = specs.map(t => StateTable.isOperatorState(t.kind))
    val (operatorLists, operatorRows) = placeOperatorLists(tables, isOperatorState, fromPartitions)
    val rows = tables.zipWithIndex.filterNot(t => isOperatorState(t._2)).map { case ((table, df), i) =>
      val broadcastState = StateTable.isBroadcast(table.kind)
      val from = fromPartitions
      KeyedProcessSqlBridge.internalRows(df).mapPartitions { it =>
        val encoder = new TableRowEncoder(table)
        it.flatMap { row =>
          val entries = encoder.entries(row).zipWithIndex
          if (!broadcastState) entries.map { case (entry, e) => encoder.owner(entry.key, n) -> ((i, entry, e == 0)) }
          else {
            // Every old partition holds the same broadcast state: new partition t takes old t % from's.
            val targets = OperatorStateRedistribution.broadcastTargets(row.getInt(0), from, n)
            entries.flatMap { case (entry, e) =>
              targets.zipWithIndex.map { case (t, k) => t -> ((i, entry, e == 0 && k == 0)) }
            }
          }
        }
      }
    }
    val v = batch
    // Kryo, not the session's serializer: UnsafeRow writes itself with Kryo in one call.
    val routed = new ShuffledRDD[Int, (Int, StoredEntry, Boolean), (Int, StoredEntry, Boolean)](
      spark.sparkContext.union(rows :+ operatorLists), new CheckpointWriter.ByPartition(n))
      .setSerializer(new KryoSerializer(spark.sparkContext.getConf))
    val written = routed
      .mapPartitionsWithIndex { (p, entries) =>
        Iterator(CheckpointWriter.writePartition(stateRoot, op, storeName, p, v, specs, declaration, storeConf,
          hadoopConf.value, entries.map(_._2)))
      }.collect()
    specs.indices.map { i =>
      if (isOperatorState(i)) operatorRows(i)
      // Broadcast rows of old partitions beyond the new count are copies no partition takes.
      else if (StateTable.isBroadcast(specs(i).kind)) tables(i)._2.count()
      else written.iterator.map(_(i)).sum
    }
  }

  /**
   * Operator lists are small: read on the driver and placed as Flink redistributes them (see
   * [[OperatorStateRedistribution.place]]; when a restore follows, the restored query's first batch
   * joins union state). Returns the entries, routed to their partition, and the rows read per table.
   */
  private def placeOperatorLists(tables: Seq[(StateTable, DataFrame)], isOperatorState: Seq[Boolean],
      from: Int): (org.apache.spark.rdd.RDD[(Int, (Int, StoredEntry, Boolean))], Seq[Long]) = {
    val read = tables.zipWithIndex.filter(t => isOperatorState(t._2)).map { case ((table, df), i) =>
      val codec = new OperatorLists.Codec(table.family.name,
        table.family.valueSchema.head.dataType.asInstanceOf[ArrayType].elementType)
      val lists = KeyedProcessSqlBridge.internalRows(df).map(_.copy()).collect().toSeq.map { row =>
        row.getInt(0) -> (if (row.isNullAt(1)) Nil else row.getArray(1).toSeq[Any](codec.elementType))
      }
      (i, table, codec, lists)
    }
    val states = read.map { case (_, table, _, lists) =>
      (table.state, OperatorStateRedistribution.modeOf(StateKind.parse(table.kind)), lists)
    }
    val byName = read.map { case (i, table, codec, _) => table.state -> (i, codec) }.toMap
    val entries = OperatorStateRedistribution.place(states, from, partitions, restoreFollows = batch >= 0).map { p =>
      val (i, codec) = byName(p.name)
      p.target -> ((i, StoredEntry(OperatorLists.partitionKey(p.key), Array(codec.valueRow(p.elements)), null), false))
    }
    val rowsRead = tables.indices.map(i => read.find(_._1 == i).fold(0L)(_._4.size.toLong))
    (spark.sparkContext.parallelize(entries, 1), rowsRead)
  }
}

object CheckpointWriter {
  /** Routes an entry to the partition its key was given. */
  private final class ByPartition(n: Int) extends Partitioner {
    override def numPartitions: Int = n
    override def getPartition(key: Any): Int = key.asInstanceOf[Int]
  }

  /** Executor side: one store partition's version `batch + 1`; the entries written per table. */
  private def writePartition(
      stateRoot: String,
      op: Int,
      storeName: String,
      partition: Int,
      batch: Long,
      tables: Seq[StateTable],
      declaration: Option[String],
      storeConf: StateStoreConf,
      hadoopConf: org.apache.hadoop.conf.Configuration,
      entries: Iterator[(Int, StoredEntry, Boolean)]): Array[Long] = {
    val first = tables.head
    val providerId = StateStoreProviderId(StateStoreId(stateRoot, op, partition, storeName), UUID.randomUUID())
    val provider = StateStoreProvider.createAndInit(providerId, first.storeKeySchema, first.storeValueSchema,
      first.storeSpec, useColumnFamilies = first.columnFamilies, storeConf, hadoopConf,
      useMultipleValuesPerKey = first.columnFamilies, None)
    val counts = new Array[Long](tables.size)
    val bootstrap = batch < 0
    if (bootstrap && !provider.isInstanceOf[KeyedStateStoreProvider]) {
      provider.close()
      throw KeyedStateErrors.unsupported(ErrorId.QueryCheckpointInvalid, s"bootstrapped state is read by " +
        s"keyedstate's provider only (the others start every query empty), not ${provider.getClass.getName}")
    }
    // Spark's HDFS-backed provider cannot open an empty store at a batch: it writes version 1
    // on top of the empty version 0, a snapshot then published as version `batch + 1`.
    val fromEmpty = provider.getClass.getName == QueryCheckpoint.SparkDefaultProvider
    try {
      val store =
        if (fromEmpty) SparkShims.getStore(provider, 0, None, forceSnapshotOnCommit = true, loadEmpty = false)
        else SparkShims.getStore(provider, math.max(batch, 0), None, forceSnapshotOnCommit = true,
          loadEmpty = true)
      try {
        if (first.columnFamilies) tables.foreach { t =>
          val f = t.family
          store.createColFamilyIfAbsent(f.name, f.keySchema, f.valueSchema, f.spec, f.multipleValues,
            f.name.startsWith("$"))
        }
        declaration.foreach { d =>
          store match {
            case ours: TaskStateStore => ours.declare(JsonMethods.parse(d))
            case other => throw KeyedStateErrors.unsupported(ErrorId.QueryCheckpointInvalid,
              s"operator $op is a keyed function: its state is written by keyedstate's provider only, not by " +
                other.getClass.getName)
          }
        }
        entries.foreach { case (i, entry, startsRow) =>
          val t = tables(i)
          val cf = t.family.name
          if (startsRow) counts(i) += 1
          if (entry.stamps != null) {
            // TTL'd state keeps its last-access times (the table is a keyed function's: our store).
            store.asInstanceOf[TaskStateStore].putStamped(entry.key, entry.values, entry.stamps, cf)
          } else if (t.family.multipleValues) StoreApi.putList(store, entry.key, entry.values, cf)
          else store.put(entry.key, entry.values.head, cf)
        }
        store.commit()
      } finally if (!store.hasCommitted) store.abort()
    } finally provider.close()
    if (bootstrap) asVersionZero(providerId.storeId.storeCheckpointLocation(), hadoopConf)
    if (fromEmpty && batch + 1 != 1) asVersion(providerId.storeId.storeCheckpointLocation(), batch + 1, hadoopConf)
    counts
  }

  /**
   * The HDFS-backed provider's version 1 as version `version`: its snapshot file (the delta goes).
   * Spark 4.0 and 4.1 write no snapshot at commit (no `forceSnapshotOnCommit`): there the delta is
   * published as the snapshot instead. A delta of puts alone on an empty store has a snapshot's
   * layout (`[key size][key][value size][value]`... ended by -1, the same codec).
   */
  private def asVersion(storeDir: Path, version: Long, hadoopConf: org.apache.hadoop.conf.Configuration): Unit = {
    val fs = storeDir.getFileSystem(hadoopConf)
    val snapshot = new Path(storeDir, "1.snapshot")
    val delta = new Path(storeDir, "1.delta")
    val written = if (fs.exists(snapshot)) snapshot else if (fs.exists(delta)) delta else {
      throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid, s"the state store at $storeDir wrote no " +
        s"snapshot $snapshot or delta $delta of the restored state")
    }
    val published = new Path(storeDir, s"$version.snapshot")
    if (!fs.rename(written, published)) {
      throw KeyedStateErrors.checkpointWrite(s"Cannot publish $published: the rename of $written failed")
    }
    // Spark 4.1+ writes a checksum of each file's bytes beside it (`<file>.crc`): it goes with them.
    val checksum = new Path(s"$written.crc")
    if (fs.exists(checksum) && !fs.rename(checksum, new Path(s"$published.crc"))) {
      throw KeyedStateErrors.checkpointWrite(s"Cannot publish $published.crc: the rename of $checksum failed")
    }
    fs.delete(delta, false)
    fs.delete(new Path(s"$delta.crc"), false)
  }

  /**
   * The committed version 1 (a full snapshot of an empty store filled) published as version 0:
   * the same files, listed by a manifest of version 0, so that the first batch loads them.
   */
  private def asVersionZero(storeDir: Path, hadoopConf: org.apache.hadoop.conf.Configuration): Unit = {
    val store = new CheckpointStore(storeDir, hadoopConf)
    val written = store.readManifest(1, None)
    if (written.changelogs.nonEmpty || written.snapshotVersion != 1) {
      throw KeyedStateErrors.badState(ErrorId.QueryCheckpointInvalid, s"${store.manifestPath(1, None)} is no " +
        "full snapshot: it cannot become bootstrapped state")
    }
    store.writeManifest(written.copy(version = 0, snapshotVersion = 0, baseCheckpointId = None),
      checkpointIdsEnabled = false)
    store.delete(store.manifestPath(1, None))
    store.listSnapshotDescriptors().filter(_.version == 1).foreach(d => store.delete(d.path))
  }

  private def isRetiredPartitionFile(relative: String, partitions: Int): Boolean =
    relative.split('/') match {
      case Array("state", _, p, _*) => p.toIntOption.exists(_ >= partitions)
      case _ => false
    }

  /** The files that say the partition count, relative to the checkpoint root: the offset log
   *  entries from `batch` on and Spark's operator metadata. */
  def pinnedFiles(ckpt: QueryCheckpoint, batch: Long): Seq[String] =
    ckpt.batches("offsets").filter(_ >= batch).map(b => s"offsets/$b") ++
      ckpt.operators.flatMap(ckpt.operatorMetadataFiles)

  /** A pinned file's text with the partition count `partitions` (operator metadata: at `ckpt`). */
  def pinnedText(ckpt: QueryCheckpoint, relative: String, partitions: Int): String =
    if (relative.startsWith("offsets/")) {
      ckpt.withPinnedConf(relative.stripPrefix("offsets/").toLong, QueryCheckpoint.PartitionsKey, partitions.toString)
    } else {
      relocated(ckpt, relative, ckpt.readLines(new Path(ckpt.root, relative)).mkString("\n")
        .replaceAll("\"numPartitions\":\\d+", s"\"numPartitions\":$partitions"))
    }

  /**
   * Operator metadata of version 2 names its operator's schema files (a keyed function: its
   * state folder) by absolute path: in a copy of the checkpoint they are the copy's own.
   */
  private def relocated(ckpt: QueryCheckpoint, relative: String, text: String): String =
    (relative.split('/'), text.split("\n", 2)) match {
      case (Array("state", op, "_metadata", "v2", _), Array(version, json)) =>
        val folder = java.util.regex.Matcher.quoteReplacement(new Path(ckpt.stateRoot, op).toString)
        val moved = JsonMethods.parse(json).transformField {
          case JField("stateSchemaFilePaths", JArray(paths)) => JField("stateSchemaFilePaths", JArray(paths.map {
            case JString(p) => JString(p.replaceFirst(s"^.*/state/$op(?=/|$$)", folder))
            case other => other
          }))
        }
        s"$version\n${JsonMethods.compact(moved)}"
      case _ => text
    }
}

/**
 * One stored entry: a family's key, its value or values (a list's elements), and, for a TTL'd
 * state, each value's last-access stamp (null: stamped with the batch's time when written; an
 * element whose stamp is missing in the table gets [[TaskStateStore.Unstamped]]).
 */
private final case class StoredEntry(key: UnsafeRow, values: Array[UnsafeRow], stamps: Array[Long])

/**
 * One row of a table in the reader's unflattened form, as its store keeps it: the family's key
 * and its value (a list state's values, a map state one entry per map key) with their
 * last-access stamps if the table has them, and the partition that owns the key (Spark's
 * `pmod(murmur3(partitioning columns), n)`). Not thread-safe.
 */
private final class TableRowEncoder(table: StateTable) {
  private val f = table.family
  private val keyProjection = UnsafeProjection.create(f.keySchema)
  private val valueProjection = UnsafeProjection.create(f.valueSchema)
  private val hasher = new KeyGroupHasher(f.keySchema, KeyGroups.partitionKeyOrdinals(table.storeName, f.keySchema, f.spec))
  private val keyTypes = f.keySchema.fields.map(_.dataType)

  def owner(key: UnsafeRow, n: Int): Int = KeyGroups.owner(hasher.tag(key), n)

  private def key(values: Seq[Any]): UnsafeRow = keyProjection(new GenericInternalRow(values.toArray)).copy()
  private def value(v: Any): UnsafeRow = valueProjection(new GenericInternalRow(Array(v))).copy()
  private def fields(row: InternalRow, from: Int, n: Int): Seq[Any] = (0 until n).map(i => row.get(from + i, keyTypes(i)))

  private def stamp(data: SpecializedGetters, i: Int): Long =
    if (data.isNullAt(i)) TaskStateStore.Unstamped else data.getLong(i)

  def entries(row: InternalRow): Seq[StoredEntry] = {
    val n = keyTypes.length
    val valueType = f.valueSchema.head.dataType
    table.kind match {
      case StateTable.SparkStore =>
        Seq(StoredEntry(keyProjection(row.getStruct(1, f.keySchema.length)).copy(),
          Array(valueProjection(row.getStruct(2, f.valueSchema.length)).copy()), null))
      case StateTable.Timers => Seq(StoredEntry(key(fields(row, 1, n)), Array(value(true)), null))
      case kind => StateKind.parse(kind) match {
        case StateKind.Value | StateKind.Broadcast =>
          val stamps = if (table.lastAccess) Array(stamp(row, 2 + n)) else null
          Seq(StoredEntry(key(fields(row, 1, n)), Array(value(row.get(1 + n, valueType))), stamps))
        case StateKind.List =>
          val array = row.getArray(1 + n)
          if (array == null || array.numElements() == 0) Nil
          else {
            val stamps = if (!table.lastAccess) null else {
              val listed = if (row.isNullAt(2 + n)) null else row.getArray(2 + n)
              Array.tabulate(array.numElements()) { i =>
                if (listed == null || i >= listed.numElements()) TaskStateStore.Unstamped else stamp(listed, i)
              }
            }
            Seq(StoredEntry(key(fields(row, 1, n)), Array.tabulate(array.numElements())(i => value(array.get(i, valueType))),
              stamps))
          }
        case StateKind.Map =>
          val map = row.getMap(n)
          val grouping = fields(row, 1, n - 1)
          if (map == null) Nil
          else {
            val stampOf: Int => Long =
              if (!table.lastAccess || row.isNullAt(n + 1)) _ => TaskStateStore.Unstamped
              else mapStamps(map.keyArray(), row.getMap(n + 1))
            (0 until map.numElements()).map { i =>
              val mapKey = map.keyArray().get(i, keyTypes.last)
              StoredEntry(key(grouping :+ mapKey), Array(value(map.valueArray().get(i, valueType))),
                if (table.lastAccess) Array(stampOf(i)) else null)
            }
          }
        case StateKind.OperatorList | StateKind.OperatorUnionList =>
          throw new IllegalStateException(s"operator state ${table.describe} is placed on the driver")
      }
    }
  }

  /** The stamp of the i-th key of `keys` in the map of stamps (the reader writes both maps in
   *  the same order; a transformed table may not). */
  private def mapStamps(keys: ArrayData, stamps: MapData): Int => Long = {
    val t = keyTypes.last
    val stampKeys = stamps.keyArray()
    def same(a: Any, b: Any) = PartitionRows.sameValue(a, b)
    i => {
      val k = keys.get(i, t)
      val j = if (i < stampKeys.numElements() && same(stampKeys.get(i, t), k)) i
        else (0 until stampKeys.numElements()).find(j => same(stampKeys.get(j, t), k)).getOrElse(-1)
      if (j < 0) TaskStateStore.Unstamped else stamp(stamps.valueArray(), j)
    }
  }
}
