package io.keyedstate.process

import java.util.UUID

import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types._
import org.apache.spark.util.SerializableConfiguration

import io.keyedstate.conf.KeyedStateErrors
import io.keyedstate.errors.ErrorId
import io.keyedstate.rescale.{QueryCheckpoint, StoreRef}

/**
 * Reads one state variable (or the timers) of a keyed function from a stopped or running
 * query's checkpoint, at its last committed batch: one typed row per key (per list element, per
 * map entry, per timer), with the partition it is stored in, typed by the declaration the
 * version's manifest records (Spark's `statestore` reader reads `stateVarName` only for its own
 * transformWithState operators). Runs as a Spark job, one task per state partition.
 */
object StateReader {
  import StateLayout.{EventTimers, ProcTimers}

  /**
   * The state `stateName` of the keyed function at `operatorId` (or named `uid`; neither: the only
   * keyed function of the checkpoint).
   */
  def read(spark: SparkSession, checkpoint: String, stateName: String, operatorId: Int, uid: String): DataFrame = {
    val hadoopConf = QueryCheckpoint.hadoopConf(spark)
    val ckpt = QueryCheckpoint.at(checkpoint, hadoopConf)
    val batch = ckpt.lastCommit()
    ckpt.requireKeyedStateProvider(batch, "read_state")
    // An operator asked for by id is read alone: another one's missing declaration does not matter.
    lazy val functions = keyedFunctions(ckpt, batch)
    def listed = if (functions.isEmpty) "none" else functions.map { case (op, d) => s"operator $op: ${d.describe}" }.mkString("; ")
    val (op, stored) = (Option(operatorId).filter(_ >= 0), Option(uid)) match {
      case (Some(id), _) if !ckpt.operators.contains(id) || id < KeyedProcessOperators.FirstOperatorId =>
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
          s"operator $id of ${ckpt.root} is not a keyed function; its keyed functions: $listed")
      case (Some(id), u) =>
        val declared = declarationOf(ckpt, batch, id)
        if (u.exists(x => !declared.uid.contains(x))) {
          throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
            s"operator $id of ${ckpt.root} is keyed function ${declared.describe}, not uid '${u.get}'")
        }
        id -> declared
      case (None, Some(u)) => functions.find(_._2.uid.contains(u)).getOrElse(throw KeyedStateErrors.badArgument(
        ErrorId.QueryCheckpointInvalid, s"${ckpt.root} has no keyed function with uid '$u'; its keyed functions: $listed"))
      case (None, None) => functions match {
        case Seq(only) => only
        case Seq() => throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"${ckpt.root} has no keyed function state")
        case _ => throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid,
          s"${ckpt.root} has several keyed functions ($listed); pass operator_id or uid")
      }
    }
    val keySchema = stored.keySchema
    val states = stored.states.map(_.toVar)
    // The query's own layout: every state's column family, and the timers'.
    val layout = new StateLayout(ProcessSpec("", stored.uid, stored.function, keySchema.fieldNames.toSeq, None, states,
      timers = true, StructType(Nil)), keySchema)
    // A row: the partition, `keyFields` fields of the stored key, then the value (if `hasValue`).
    val (family, rowSchema, keyFields, hasValue) = stateName match {
      case EventTimers | ProcTimers =>
        val f = if (stateName == EventTimers) layout.eventTimers else layout.procTimers
        (f, f.keySchema, f.keySchema.length, false)
      case name =>
        val v = states.find(_.name == name).getOrElse(
          throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"keyed function ${stored.describe} (operator $op) has no state " +
            s"'$name'; its states are ${states.map(s => s"'${s.name}'").mkString(", ")}, and " +
            s"$EventTimers, $ProcTimers"))
        val f = layout.family(v)
        v.kind match {
          case StateKind.OperatorList => (f, f.valueSchema, 0, true)
          case _ => (f, StructType(f.keySchema.fields ++ f.valueSchema.fields), f.keySchema.length, true)
        }
    }
    val schema = StructType(StructField("partition_id", IntegerType, nullable = false) +: rowSchema.fields)
    val partitions = ckpt.partitions(op)
    // Checkpoint format v2: each partition's store is loaded by the id the commit recorded.
    val ids = ckpt.defaultStoreCheckpointIds(batch, op, partitions)
    // The offset log does not pin the format version; the stores must know they are loaded by id.
    val formatConf = if (ids.isEmpty) Map.empty else Map(CheckpointFormatVersionKey -> "2")
    val conf = KeyedProcessSqlBridge.sqlConfWith(spark, ckpt.pinnedConf(batch) ++ formatConf)
    // TTL'd states read as the query sees them at its last batch: expired entries hidden.
    val storeConf = new StateStoreConf(conf, StoreOptions.ttlOptions(states, op))
    val serializableConf = new SerializableConfiguration(hadoopConf)
    val stateRoot = ckpt.stateRoot.toString
    val version = batch + 1
    val rdd = spark.sparkContext.parallelize(partitions, math.max(1, partitions.size)).mapPartitions { ps =>
      ps.flatMap { partition =>
        readPartition(stateRoot, op, partition, version, ids.get(partition), keySchema, family, storeConf,
          serializableConf.value, keyFields, hasValue)
      }
    }
    KeyedProcessSqlBridge.internalCreateDataFrame(spark, rdd, schema)
  }

  private val CheckpointFormatVersionKey = "spark.sql.streaming.stateStore.checkpointFormatVersion"

  /**
   * The keyed functions of a checkpoint at `batch`, by operator id: the declaration partition 0's
   * manifest of the version the batch committed records.
   */
  def keyedFunctions(ckpt: QueryCheckpoint, batch: Long): Seq[(Int, OperatorDeclaration)] =
    ckpt.operators.filter(_ >= KeyedProcessOperators.FirstOperatorId).map(op => op -> declarationOf(ckpt, batch, op))

  private def declarationOf(ckpt: QueryCheckpoint, batch: Long, op: Int): OperatorDeclaration = {
    val id = ckpt.defaultStoreCheckpointIds(batch, op, Seq(0)).get(0)
    val dir = ckpt.storeDir(StoreRef(op, StateStoreId.DEFAULT_STORE_NAME, 0))
    OperatorDeclaration.read(dir, batch + 1, id, ckpt.hadoopConf, op)
  }

  private def readPartition(
      stateRoot: String,
      op: Int,
      partition: Int,
      version: Long,
      checkpointId: Option[String],
      keySchema: StructType,
      family: Family,
      storeConf: StateStoreConf,
      hadoopConf: org.apache.hadoop.conf.Configuration,
      keyFields: Int,
      hasValue: Boolean): Seq[InternalRow] = {
    val providerId = StateStoreProviderId(StateStoreId(stateRoot, op, partition), UUID.randomUUID())
    val provider = StateStoreProvider.createAndInit(providerId, keySchema,
      StructType(Seq(StructField("value", BooleanType))), NoPrefixKeyStateEncoderSpec(keySchema),
      useColumnFamilies = true, storeConf, hadoopConf, useMultipleValuesPerKey = true, None)
    try {
      val store = provider.getReadStore(version, checkpointId)
      try {
        // Registering tells the store how to decode the family (it may not exist yet).
        store.registerColFamily(family.name, family.keySchema, family.valueSchema, family.spec,
          family.multipleValues, family.name.startsWith("$"))
        if (!store.allColumnFamilyNames.contains(family.name)) Nil
        else {
          val it = if (family.multipleValues) store.iteratorWithMultiValues(family.name) else store.iterator(family.name)
          try it.map { pair =>
            val out = new GenericInternalRow(1 + keyFields + (if (hasValue) 1 else 0))
            out.update(0, partition)
            var i = 0
            while (i < keyFields) {
              out.update(1 + i, pair.key.get(i, family.keySchema(i).dataType))
              i += 1
            }
            if (hasValue) out.update(1 + keyFields, pair.value.get(0, family.valueSchema(0).dataType))
            out.copy(): InternalRow
          }.toVector finally it.close()
        }
      } finally store.release()
    } finally provider.close()
  }
}
