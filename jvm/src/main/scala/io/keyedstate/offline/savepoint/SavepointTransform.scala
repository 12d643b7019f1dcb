package io.keyedstate.offline.savepoint

import org.apache.spark.SPARK_VERSION
import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.types.DataType
import org.json4s.jackson.JsonMethods

import io.keyedstate.engine.KeyedProcessOperators
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.offline.{QueryCheckpoint, SavepointMetadata, SavepointOperator, StateReader, StateTable, StateTables}

/** `keyedstate.state.transform` (docs/state-processor.md): a savepoint made from another, changed. */
final class SavepointTransform(spark: SparkSession, progress: String => Unit) {
  private val hadoopConf = QueryCheckpoint.hadoopConf(spark)

  /**
   * A new canonical savepoint at `target` from the savepoint at `source` (native or canonical),
   * changed: keyed functions' uids renamed (`renames`, old to new), keyed functions or their
   * states dropped (`drops`: an operator, by uid or id, and a state, or "" for the whole
   * function), tables replaced by new rows of the same schema (`replacements`, by operator and
   * state: the reader's unflattened form, typically a map or filter of the table), keyed
   * functions added (`additions`: a uid, and the savepoint holding a keyed function with that
   * uid, such as one `state.bootstrap` wrote; its state goes in under the next free operator id,
   * and a restored query finds it by uid). The query's logs stay as they are. Flink's
   * `SavepointWriter.fromExistingSavepoint` with `removeOperator`, `changeOperatorIdentifier`
   * and `withOperator`.
   */
  def run(source: String, target: String, renames: Map[String, String], drops: Seq[(String, String)],
      replacements: Map[(String, String), DataFrame], additions: Seq[(String, String)] = Nil): SavepointMetadata = {
    val sp = QueryCheckpoint.at(source, hadoopConf)
    val m = SavepointMetadata.read(sp.fs, sp.root)
    val dst = new SavepointTarget(QueryCheckpoint.at(target, hadoopConf), progress)
    dst.refuseOverlap(sp)
    val tables = StateTables(sp, m)
    def keyedFunction(operator: String): (Int, Seq[StateTable]) = {
      val (op, ts) = tables.operatorOf(operator)
      if (!ts.exists(_.isKeyedFunction)) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"operator $op of $source is Spark's " +
          s"${m.operators.find(_.operatorId == op).map(_.name).getOrElse("")}: only keyed functions are renamed or " +
          "dropped (Spark's operators have no uid, and a query without one of them cannot start on its state)")
      }
      (op, ts)
    }
    val droppedOps = drops.filter(_._2.isEmpty).map(d => keyedFunction(d._1)._1).toSet
    val droppedStates = drops.filter(_._2.nonEmpty).map { case (o, st) =>
      val op = keyedFunction(o)._1
      tables.find(op.toString, st).operatorId -> st
    }.toSet
    val renamed = renames.map { case (from, to) =>
      val (op, _) = keyedFunction(from)
      if (tables.operators.exists(_._2.exists(_.uid == to))) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"a keyed function of $source already " +
          s"has the uid '$to': uids name one operator each")
      }
      op -> to
    }
    val replaced = replacements.map { case ((o, st), rows) =>
      val table = tables.find(o, st)
      val expected = StateReader.schemaOf(table, flatten = false)
      val sameColumns = rows.schema.fieldNames.sameElements(expected.fieldNames) &&
        DataType.equalsStructurally(rows.schema, expected, ignoreNullability = true)
      if (!sameColumns) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"the rows replacing ${table.describe} " +
          s"have the schema ${rows.schema.simpleString}; its table's is ${expected.simpleString} (the reader's " +
          "unflattened form: keyedstate.state.read(..., flatten=False))")
      }
      (table.operatorId, table.state) -> rows
    }
    val uidsKept = tables.operators.filterNot(o => droppedOps(o._1))
      .flatMap { case (op, ts) => renamed.get(op).orElse(ts.headOption.map(_.uid)) }.filter(_.nonEmpty).toSet
    val added = additions.zipWithIndex.map { case ((uid, from), i) =>
      if (uid.isEmpty) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"cannot add a keyed function from $from " +
          "without a uid: a restored query finds an added function by its uid")
      }
      if (uidsKept(uid) || additions.take(i).exists(_._1 == uid)) {
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"cannot add the keyed function with uid " +
          s"'$uid' from $from: the transformed savepoint already has one (uids name one operator each; drop it first)")
      }
      val other = QueryCheckpoint.at(from, hadoopConf)
      val om = SavepointMetadata.read(other.fs, other.root)
      val otherTables = StateTables(other, om)
      val (op, ts) = otherTables.operators.find(_._2.exists(t => t.isKeyedFunction && t.uid == uid)).getOrElse(
        throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"the savepoint $from has no keyed " +
          s"function with uid '$uid' (its keyed functions: ${otherTables.operators.flatMap(_._2.headOption)
            .filter(_.isKeyedFunction).map(t => s"'${t.uid}'").mkString(", ")})"))
      (other, om, otherTables, op, ts)
    }
    val firstFreeId = (tables.operators.map(_._1) :+ (KeyedProcessOperators.FirstOperatorId - 1)).max + 1
    dst.prepare()
    progress(s"transforming ${sp.root} (${m.format}, batch ${m.batchId}) into a canonical savepoint at " +
      s"${dst.folder.root}")
    dst.writing(sp.root) {
      val stateFiles = m.files.filter(f => f.path.startsWith(CanonicalFormat.TablesDir + "/") ||
        (f.path.startsWith("state/") && (Savepoints.isStoreFile(f.path) || f.path.endsWith(".manifest"))))
      val logs = m.files.filterNot(stateFiles.contains).map(f => Savepoints.copyFile(sp, dst.folder, f.path))
      val operators = tables.operators.filterNot(o => droppedOps(o._1)).map { case (op, opTables) =>
        val kept = opTables.filterNot(t => droppedStates((op, t.state)))
        val written = kept.zipWithIndex.map { case (table, i) =>
          progress(s"writing ${table.describe}")
          val rows = replaced.getOrElse((op, table.state), StateReader.readSaved(spark, sp, m, table, flatten = false))
          CanonicalFormat.writeTable(spark, dst.folder, i, table, rows)
        }
        val declaration = tables.declarationOf(op).map { d =>
          d.copy(uid = renamed.get(op).orElse(d.uid), states = d.states.filterNot(s => droppedStates((op, s.name))))
        }
        val was = m.operators.find(_.operatorId == op)
        SavepointOperator(op, was.map(_.name).getOrElse(""), kept.map(_.storeName).distinct,
          kept.headOption.map(_.function).getOrElse(""), renamed.getOrElse(op, kept.headOption.map(_.uid).getOrElse("")),
          declaration.map(d => JsonMethods.compact(d.toJson)), written)
      }
      val additionsWritten = added.zipWithIndex.map { case ((other, om, otherTables, op, ts), i) =>
        val id = firstFreeId + i
        val written = ts.zipWithIndex.map { case (table, n) =>
          progress(s"adding ${table.describe} as operator $id")
          CanonicalFormat.writeTable(spark, dst.folder, n, table.copy(operatorId = id),
            StateReader.readSaved(spark, other, om, table, flatten = false))
        }
        val declaration = otherTables.declarationOf(op).map(d => JsonMethods.compact(d.toJson))
        SavepointOperator(id, om.operators.find(_.operatorId == op).map(_.name).getOrElse(""),
          ts.map(_.storeName).distinct, ts.head.function, ts.head.uid, declaration, written)
      }
      val allOperators = operators ++ additionsWritten
      val tableFiles = allOperators.flatMap(_.tables).flatMap(t => CanonicalFormat.dataFiles(dst.folder, t.path))
      m.copy(format = SavepointMetadata.Canonical, keyedstateVersion = Savepoints.KeyedstateVersion,
        sparkVersion = SPARK_VERSION, createdAtMs = System.currentTimeMillis(), source = sp.root.toString,
        operators = allOperators, files = tableFiles ++ logs)
    }
  }
}
