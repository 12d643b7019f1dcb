package io.keyedstate.offline

import scala.util.Random

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.offline.OperatorStateRedistribution._

/** Operator state moved to another partition count as Flink's round-robin repartitioner moves it. */
class OperatorStateRedistributionSuite extends AnyFunSuite {
  private def split[A](name: String, lists: Seq[A]*) = NamedState(name, EvenSplit, lists.toIndexedSeq)
  private def union[A](name: String, lists: Seq[A]*) = NamedState(name, Union, lists.toIndexedSeq)

  test("an even split cuts the joined lists into consecutive runs, the longer ones first") {
    val Seq(("a", lists)) = redistribute(Seq(split("a", Seq(1, 2, 3), Seq(4, 5))), 3)
    assert(lists == IndexedSeq(Seq(1, 2), Seq(3, 4), Seq(5)))
    val Seq(("a", down)) = redistribute(Seq(split("a", Seq(1, 2), Seq(3), Seq(4, 5, 6))), 2)
    assert(down == IndexedSeq(Seq(1, 2, 3), Seq(4, 5, 6)))
    val Seq(("a", one)) = redistribute(Seq(split("a", Seq(1), Seq(2, 3))), 1)
    assert(one == IndexedSeq(Seq(1, 2, 3)))
  }

  test("the next state's longer runs start where the previous state's ended (Flink's round robin)") {
    val moved = redistribute(Seq(split("a", Seq(1, 2, 3), Seq(4, 5)), split("b", Seq(6, 7), Seq(8, 9))), 3).toMap
    assert(moved("a") == IndexedSeq(Seq(1, 2), Seq(3, 4), Seq(5))) // 5 over 3: two longer runs, from 0
    assert(moved("b") == IndexedSeq(Seq(8), Seq(9), Seq(6, 7))) // 4 over 3: one longer run, from 2
  }

  test("at the same count an even split keeps every list where it is; a union joins them everywhere") {
    val moved = redistribute(Seq(split("a", Seq(1), Seq(2, 3)), union("u", Seq(7), Seq(8, 9))), 2).toMap
    assert(moved("a") == IndexedSeq(Seq(1), Seq(2, 3)))
    assert(moved("u") == IndexedSeq(Seq(7, 8, 9), Seq(7, 8, 9)))
    val Seq(("u", up)) = redistribute(Seq(union("u", Seq(7), Seq(8, 9))), 3)
    assert(up == IndexedSeq.fill(3)(Seq(7, 8, 9)))
  }

  test("any lists, any counts: nothing lost or repeated, sizes within one, order kept along the rotation") {
    val random = new Random(7)
    for (_ <- 1 to 500) {
      val from = 1 + random.nextInt(6)
      val to = 1 + random.nextInt(6)
      var next = 0
      val states = (0 until 1 + random.nextInt(3)).map { s =>
        split(s"s$s", (0 until from).map(_ => Seq.fill(random.nextInt(5)) { next += 1; next }): _*)
      }
      val moved = redistribute(states, to)
      moved.zip(states).foreach { case ((name, lists), state) =>
        assert(lists.size == to)
        val all = state.lists.flatten
        if (from == to) assert(lists == state.lists, name)
        else {
          val sizes = lists.map(_.size)
          assert(sizes.max - sizes.min <= 1, s"$name: $sizes")
          // Read from the first partition given a longer run, the runs are the joined list in order.
          val starts = (0 until to).filter(p => lists.indices.forall(q => lists(q) == Nil || lists(p) != Nil))
          assert(starts.exists(p => (0 until to).flatMap(i => lists((p + i) % to)) == all), s"$name: $lists")
        }
      }
    }
  }

  test("placed for a rewrite: split shares under the new partitions, union lists kept apart for the restore") {
    val states = Seq(
      ("counts", EvenSplit, Seq(2 -> Seq(5), 0 -> Seq(3), 1 -> Seq(4), 3 -> Seq(6))),
      ("members", Union, Seq(0 -> Seq("a"), 3 -> Seq("d"), 1 -> Seq("b"))))
    val placed = place(states, from = 4, to = 3, restoreFollows = true)
    assert(placed.filter(_.name == "counts") ==
      Seq(Placed("counts", 0, 0, Seq(3, 4)), Placed("counts", 1, 1, Seq(5)), Placed("counts", 2, 2, Seq(6))))
    // Each old list whole, under its own id, in partition id % 3: the restored batch joins them.
    assert(placed.filter(_.name == "members").toSet ==
      Set(Placed("members", 0, 0, Seq("a")), Placed("members", 0, 3, Seq("d")), Placed("members", 1, 1, Seq("b"))))
    // No restore follows (bootstrapped state): every partition stores the joined list at once.
    val bootstrapped = place(states.drop(1), from = 4, to = 2, restoreFollows = false)
    assert(bootstrapped == Seq(Placed("members", 0, 0, Seq("a", "b", "d")), Placed("members", 1, 1, Seq("a", "b", "d"))))
  }

  test("a rewrite refuses lists it cannot place, naming the state and the partition") {
    val twice = intercept[IllegalArgumentException](
      place(Seq(("c", EvenSplit, Seq(0 -> Seq(1), 0 -> Seq(2)))), from = 2, to = 3, restoreFollows = true))
    assert(twice.getMessage.contains("operator state 'c' has 2 lists of partition 0"))
    val beyond = intercept[IllegalArgumentException](
      place(Seq(("c", EvenSplit, Seq(5 -> Seq(1)))), from = 2, to = 3, restoreFollows = true))
    assert(beyond.getMessage.contains("a list of partition 5, written at 2 partitions"))
  }

  test("broadcast state: new partition t takes old t % from's copy; copies beyond the new count go nowhere") {
    for (from <- 1 to 6; to <- 1 to 6) {
      val targets = (0 until from).map(p => broadcastTargets(p, from, to))
      assert(targets.flatten.sorted == (0 until to), s"$from -> $to")
      targets.zipWithIndex.foreach { case (ts, p) => assert(ts.forall(_ % from == p), s"$from -> $to") }
    }
    assert(broadcastTargets(2, 3, 2).isEmpty)
  }
}
