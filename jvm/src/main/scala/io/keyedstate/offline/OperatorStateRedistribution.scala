package io.keyedstate.offline

import io.keyedstate.engine.StateKind

/**
 * How a keyed function's operator state (a list per state partition, `$op_<name>`) moves to another
 * partition count, exactly as Flink redistributes operator state on rescale
 * (`RoundRobinOperatorStateRepartitioner`):
 *
 *  - **even split** (`get_list_state`, Flink's `SPLIT_DISTRIBUTE`): the old partitions' lists are
 *    joined in partition order and cut into `to` consecutive runs whose sizes differ by one at most;
 *    the longer runs go first, starting, for each named state after the first, at the partition
 *    where the previous state's longer runs ended (Flink's round robin across states, so that the
 *    extra elements do not always land on partition 0). At the same count nothing moves.
 *  - **union** (`get_union_list_state`, Flink's `UNION`): every new partition gets the whole
 *    joined list, also at the same count.
 *
 * Pure: the elements are whatever the caller stores (decoded values or their bytes).
 */
object OperatorStateRedistribution {
  sealed abstract class Mode(val name: String)
  case object EvenSplit extends Mode("even_split")
  case object Union extends Mode("union")

  /**
   * Flink's rule for broadcast state (every old partition holds the same): the new partitions
   * that take old partition `source`'s copy, `t % from == source`; none for a copy beyond `to`.
   */
  def broadcastTargets(source: Int, from: Int, to: Int): Seq[Int] = (source until to by from)

  /** How a keyed function's operator state kind moves. */
  def modeOf(kind: StateKind): Mode = kind match {
    case StateKind.OperatorList => EvenSplit
    case StateKind.OperatorUnionList => Union
    case other => throw new IllegalArgumentException(s"${other.name} state is not operator state")
  }

  /** One named state's lists, one per old partition in partition order, and how it moves. */
  final case class NamedState[A](name: String, mode: Mode, lists: IndexedSeq[Seq[A]])

  /**
   * Every named state's new lists, one per new partition, for `to` partitions. States are taken in
   * the order given (Flink takes them in its map's order; here the declaration's order, which every
   * rescale of the same query sees alike).
   */
  def redistribute[A](states: Seq[NamedState[A]], to: Int): Seq[(String, IndexedSeq[Seq[A]])] = {
    require(to >= 1, s"a partition count is at least 1, not $to")
    var start = 0
    states.map { state =>
      val from = state.lists.size
      val lists = state.mode match {
        case Union => IndexedSeq.fill(to)(state.lists.flatten)
        case EvenSplit if from == to => state.lists
        case EvenSplit =>
          val (split, nextStart) = evenSplit(state.lists.flatten.toIndexedSeq, to, start)
          start = nextStart
          split
      }
      state.name -> lists
    }
  }

  /** A list a new partition stores: in partition `target`, under the partition id `key`. */
  final case class Placed[A](name: String, target: Int, key: Int, elements: Seq[A])

  /**
   * What each of `to` new partitions stores when operator state written by `from` partitions is
   * rewritten (a rescale, a restored canonical savepoint, bootstrapped state); `states` give each
   * stored list with the partition that wrote it. Even-split states are split now, each share
   * stored under its new partition. Union states are joined by the restore that follows
   * (`engine.UnionListRestore`), so each old list is kept whole under its own id, in partition
   * `id % to`; where no restore follows (`restoreFollows` false: bootstrapped state, which the
   * query's first batch starts from as it is) every new partition stores the joined list, as a
   * restore would give it. Empty lists are not stored.
   */
  def place[A](states: Seq[(String, Mode, Seq[(Int, Seq[A])])], from: Int, to: Int,
      restoreFollows: Boolean): Seq[Placed[A]] = {
    val ordered = states.map { case (name, mode, lists) =>
      val byId = lists.groupBy(_._1)
      byId.collectFirst { case (id, several) if several.size > 1 =>
        throw new IllegalArgumentException(s"operator state '$name' has ${several.size} lists of partition $id")
      }
      (name, mode, lists.sortBy(_._1))
    }
    val split = ordered.collect { case (name, EvenSplit, lists) =>
      lists.collectFirst { case (id, _) if id < 0 || id >= from =>
        throw new IllegalArgumentException(s"operator state '$name' has a list of partition $id, " +
          s"written at $from partitions")
      }
      val byId = lists.toMap
      NamedState(name, EvenSplit, IndexedSeq.tabulate(from)(i => byId.getOrElse(i, Nil)))
    }
    val splitPlaced = redistribute(split, to).flatMap { case (name, lists) =>
      lists.zipWithIndex.map { case (elements, t) => Placed(name, t, t, elements) }
    }
    val unionPlaced = ordered.collect { case (name, Union, lists) =>
      if (restoreFollows) lists.map { case (id, elements) => Placed(name, id % to, id, elements) }
      else (0 until to).map(t => Placed(name, t, t, lists.flatMap(_._2)))
    }.flatten
    (splitPlaced ++ unionPlaced).filter(_.elements.nonEmpty)
  }

  /**
   * `elements` cut into `to` consecutive runs, the `elements.size % to` longer ones first, handed
   * out from partition `start` on (wrapping); and the partition the next state starts at: the first
   * one given a shorter run (Flink's `newStartParallelOp`), `start` when every run has one length.
   */
  private def evenSplit[A](elements: IndexedSeq[A], to: Int, start: Int): (IndexedSeq[Seq[A]], Int) = {
    val base = elements.size / to
    val longer = elements.size % to
    val out = Array.fill[Seq[A]](to)(Nil)
    var offset = 0
    var nextStart = start
    for (i <- 0 until to) {
      val partition = (i + start) % to
      val size = if (i < longer) base + 1 else base
      if (i == longer) nextStart = partition
      out(partition) = elements.slice(offset, offset + size)
      offset += size
    }
    (out.toIndexedSeq, nextStart)
  }
}
