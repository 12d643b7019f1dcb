package io.keyedstate.offline.rescale

import org.json4s.jackson.JsonMethods.parse

import io.keyedstate.checkpoint.InlineEntry
import io.keyedstate.engine.{OperatorDeclaration, OperatorLists}
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.offline.OperatorStateRedistribution

/** The driver's part of a rescale for operator state: small, it moves through the driver. */
private[rescale] object RescaledOperatorState {
  /**
   * A keyed function's operator lists at the new count, per new partition and column family, as
   * Flink redistributes them (see `OperatorStateRedistribution.place`; the restored query's first
   * batch joins union state).
   */
  def lists(op: Int, store: String, declarationJson: Option[String],
      splits: Seq[SplitResult], from: Int, to: Int): Map[Int, Map[String, Seq[InlineEntry]]] = {
    val stored = splits.flatMap(_.partitionLocal.toSeq).groupBy(_._1).view.mapValues(_.flatMap(_._2)).toMap
    if (stored.isEmpty) return Map.empty
    val declared = declarationJson.flatMap(d => OperatorDeclaration.fromJson(parse(d), s"operator $op's manifests"))
      .map(_.states.map(_.toVar).filter(_.kind.isOperatorState)).getOrElse(Nil)
    stored.keys.filterNot(cf => declared.exists(_.columnFamily == cf)).foreach { cf =>
      throw KeyedStateErrors.badState(ErrorId.RescaleRefused, s"operator $op (store '$store') stores operator " +
        s"state in column family '$cf', which its declaration does not name: it cannot be redistributed")
    }
    val codecs = declared.map(v => v.name -> OperatorLists.codec(v)).toMap
    val states = declared.map { v =>
      val codec = codecs(v.name)
      (v.name, OperatorStateRedistribution.modeOf(v.kind),
        stored.getOrElse(v.columnFamily, Nil).map(e => codec.decode(e.keyBytes, e.valueBytes)))
    }
    val byName = declared.map(v => v.name -> v).toMap
    OperatorStateRedistribution.place(states, from, to, restoreFollows = true).groupBy(_.target).map { case (t, placed) =>
      t -> placed.groupBy(p => byName(p.name).columnFamily).map { case (cf, lists) =>
        cf -> lists.map { p =>
          val (key, value) = codecs(p.name).encode(p.key, p.elements)
          InlineEntry(key, value)
        }
      }
    }
  }

}
