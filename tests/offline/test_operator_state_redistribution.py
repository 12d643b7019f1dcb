"""Operator state redistributed exactly as Flink does (issue 35), with the seeds' example: a
function counting its elements per parallel instance (even split, ``get_list_state``) and keeping
one entry per instance in a union state (``get_union_list_state``). A restart at the same count,
rescales up and down, a native and a canonical savepoint restored at another count: at each,
every new partition restores what Flink's ``RoundRobinOperatorStateRepartitioner`` would give
it (a model of the rule below), and the restored counts add up to every element seen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyedstate
from keyedstate import examples
from pyspark.sql import SparkSession

from tests.support.keyed_functions import RestoredOperatorLists
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    start_query,
)

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
KEYS = 96  # enough keys that every partition of up to 6 gets some
OUTPUT = "partition int, counts array<long>, members array<string>"


# ---------------------------------------------------------------------------------------------
# Flink's rule, written from its description (RoundRobinOperatorStateRepartitioner)


def even_split(lists: list[list[Any]], to: int) -> list[list[Any]]:
    """The old partitions' lists joined in partition order and cut into ``to`` consecutive runs,
    the ``len % to`` longer ones first (the first split state starts at partition 0); at the
    same count every list stays."""
    if len(lists) == to:
        return [list(x) for x in lists]
    joined = [e for x in lists for e in x]
    base, longer = divmod(len(joined), to)
    out, at = [], 0
    for i in range(to):
        size = base + (1 if i < longer else 0)
        out.append(joined[at : at + size])
        at += size
    return out


def union(lists: list[list[Any]], to: int) -> list[list[Any]]:
    """Every new partition gets every old list, joined in partition order."""
    return [[e for x in lists for e in x] for _ in range(to)]


# ---------------------------------------------------------------------------------------------


class Line:
    """One query's checkpoint and input; ``run`` adds a micro-batch of every key and runs it."""

    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.spark = spark
        self.source = FileInput(root / "input", examples.PAIRS)
        self.seen = 0

    def run(self, checkpoint: Path, partitions: int) -> dict[int, tuple[list[int], list[str]]]:
        """What each partition restored in the new batch: partition -> (counts, members)."""
        batch = len(self.source.files)
        rows = [{"key": k, "value": batch} for k in range(KEYS) for _ in range(k % 3 + 1)]
        self.source.add(rows)
        previous = self.spark.conf.get(SHUFFLE_PARTITIONS)
        self.spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))  # a new checkpoint pins it
        try:
            frame = keyedstate.key_by(self.source.read_stream(self.spark), "key").flat_map(
                RestoredOperatorLists(), OUTPUT
            )
            collector = BatchCollector()
            await_finished(
                start_query(self.spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
            )
        finally:
            self.spark.conf.set(SHUFFLE_PARTITIONS, previous)
        (batch,) = collector.non_empty().values()
        restored = {r["partition"]: (list(r["counts"]), list(r["members"])) for r in batch}
        assert sorted(restored) == list(range(partitions)), f"partitions without input: {restored}"
        self.seen += len(rows)
        return restored


def stored(spark: SparkSession, checkpoint: Path, state: str) -> list[list[Any]]:
    """The lists a checkpoint's partitions store, by partition (before a rescale: one each)."""
    rows = keyedstate.state.read(spark, str(checkpoint), state=state, flatten=False).collect()
    by_partition: dict[int, list[Any]] = {}
    for r in rows:
        partition = r["partition_id"]
        assert partition not in by_partition, f"several lists of {state} in {partition}"
        by_partition[partition] = list(r["value"])
    return [by_partition.get(p, []) for p in range(max(by_partition) + 1)]


def expect(
    restored: dict[int, tuple[list[int], list[str]]],
    counts: list[list[int]],
    members: list[list[str]],
    to: int,
    seen: int,
) -> None:
    assert {p: r[0] for p, r in restored.items()} == dict(enumerate(even_split(counts, to)))
    assert {p: r[1] for p, r in restored.items()} == dict(enumerate(union(members, to)))
    assert sum(sum(r[0]) for r in restored.values()) == seen


def steps(spark: SparkSession, tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    """(how the state was moved, the checkpoint to run, its partition count): a restart at the
    same count, a rescale up, a rescale down whose state is saved before any run (its union
    lists still apart) in a canonical savepoint restored at another count, and a native
    savepoint restored at another count."""
    line_root = tmp_path / "line"
    first = line_root / "four"
    yield "start", first, 4
    yield "restart", first, 4
    six = line_root / "six"
    keyedstate.rescale(spark, str(first), 6, str(six))
    yield "rescale 4 -> 6", six, 6
    three = line_root / "three"
    keyedstate.rescale(spark, str(six), 3, str(three))
    savepoint = line_root / "savepoint"
    keyedstate.savepoint(spark, str(three), str(savepoint), format="canonical")
    two = line_root / "two"
    keyedstate.restore_savepoint(spark, str(savepoint), str(two), partitions=2)
    yield "rescale 6 -> 3, canonical savepoint 3 -> 2", two, 2
    native = line_root / "native"
    keyedstate.savepoint(spark, str(two), str(native))
    five = line_root / "five"
    keyedstate.restore_savepoint(spark, str(native), str(five), partitions=5)
    yield "native savepoint 2 -> 5", five, 5


def test_each_restore_hands_every_partition_what_flink_would(
    spark: SparkSession, tmp_path: Path
) -> None:
    line = Line(spark, tmp_path)
    before: tuple[list[list[int]], list[list[str]]] | None = None
    previous: Path | None = None
    for how, checkpoint, partitions in steps(spark, tmp_path):
        seen = line.seen
        restored = line.run(checkpoint, partitions)
        if before is None:
            assert all(r == ([], []) for r in restored.values()), restored
        else:
            expect(restored, *before, partitions, seen)
        # Every partition ran: each stores its count and its own member entry.
        before = (stored(spark, checkpoint, "counts"), stored(spark, checkpoint, "members"))
        assert len(before[0]) == partitions and all(len(x) == 1 for x in before[1]), (how, before)
        assert sum(c for x in before[0] for c in x) == line.seen, how
        previous = checkpoint
    assert previous is not None


def test_every_partition_snapshots_its_own_list_at_a_restore(
    spark: SparkSession, tmp_path: Path
) -> None:
    """As every Flink subtask snapshots at every checkpoint, every partition runs its function in
    a restored batch, also without input: each stores its own entry, not the union it was given,
    and the next restore joins one entry per partition."""
    line = Line(spark, tmp_path)
    checkpoint = tmp_path / "checkpoint"
    line.run(checkpoint, 3)
    counts = [x[0] for x in stored(spark, checkpoint, "counts")]

    def restore_with_one_key() -> list[dict[str, Any]]:
        # One key: one partition has input, the other two only restore.
        line.source.add([{"key": 0, "value": 1}])
        frame = keyedstate.key_by(line.source.read_stream(spark), "key").flat_map(
            RestoredOperatorLists(), OUTPUT
        )
        collector = BatchCollector()
        query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
        await_finished(query)
        (batch,) = collector.non_empty().values()
        return batch

    (report,) = restore_with_one_key()
    ran = report["partition"]
    assert len(report["members"]) == 3, report
    counts[ran] += 1
    assert stored(spark, checkpoint, "members") == [[f"{p}:{counts[p]}"] for p in range(3)]
    (report,) = restore_with_one_key()
    assert report["members"] == [f"{p}:{counts[p]}" for p in range(3)], report
