package io.keyedstate.offline

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
