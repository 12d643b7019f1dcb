"""The per-key engine on real queries: chained keyed functions, side outputs, ``close()``, and
typed state read back per key. Every scenario runs in two phases over one checkpoint (the second
restarts the query) on keyedstate's provider and on Spark's RocksDB provider side by side."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import keyedstate.state
from keyedstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    OutputTag,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    key_by,
    side_output,
)
from keyedstate import inspect as keyedstate_inspect
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.state_api_support import on_keyedstate, run_jobs, ship_by_value, stored_state
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    sort_rows,
    start_query,
)

ship_by_value(__name__)

SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("grp", StringType()),
        StructField("cat", StringType()),
        StructField("v", LongType()),
        StructField("seq", LongType()),
    ]
)
FILES = [
    [("a", "g1", "x", 1), ("b", "g1", "y", 12), ("c", "g2", "x", 3), ("a", "g1", "y", 4)],
    [("a", "g1", "x", 20), ("d", "g2", "z", 5), ("b", "g1", "y", 1)],
    # after the restart
    [("c", "g2", "x", 7), ("a", "g1", "z", 11), ("d", "g2", "z", 2), ("e", "g3", "x", 30)],
    [("b", "g1", "x", 6)],
]


def rows_of(files: list[list[tuple]]) -> list[list[dict[str, Any]]]:
    out, seq = [], 0
    for rows in files:
        batch = []
        for k, grp, cat, v in rows:
            batch.append({"k": k, "grp": grp, "cat": cat, "v": v, "seq": seq})
            seq += 1
        out.append(batch)
    return out


INPUT = rows_of(FILES)
PHASES = [{"events": INPUT[:2]}, {"events": INPUT[2:]}]


class Profile(KeyedProcessFunction):
    """Per key: a count, the last 3 categories, per-category totals; emits them per element, and
    to the side output 'big' the elements with v >= 10."""

    BIG = OutputTag("big", Types.ROW_NAMED(["k", "v"], [Types.STRING(), Types.LONG()]))

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.last = runtime_context.get_list_state(ListStateDescriptor("last", Types.STRING()))
        self.totals = runtime_context.get_map_state(
            MapStateDescriptor("totals", Types.STRING(), Types.LONG())
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        self.last.add(value.cat)
        last = self.last.get()
        if len(last) > 3:
            self.last.update(last[-3:])
        self.totals.put(value.cat, (self.totals.get(value.cat) or 0) + value.v)
        if value.v >= 10:
            ctx.output(self.BIG, (value.k, value.v))
        yield value.k, value.grp, count, value.seq, self.totals.get(value.cat)


PROFILE_OUT = "k string, grp string, count long, seq long, total long"


class GroupSum(KeyedProcessFunction):
    """Keyed by group, downstream of Profile: the running sum of the counts it emitted."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.sum = runtime_context.get_state(ValueStateDescriptor("sum", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        total = (self.sum.value() or 0) + value.count
        self.sum.update(total)
        yield value.grp, value.seq, total


def model() -> tuple[dict, dict, dict, dict]:
    """Per batch: Profile's outputs, its 'big' side outputs, GroupSum's outputs; and the final
    state of every key (count, last, totals)."""
    count: dict[str, int] = defaultdict(int)
    last: dict[str, list[str]] = defaultdict(list)
    totals: dict[str, dict[str, int]] = defaultdict(dict)
    group_sum: dict[str, int] = defaultdict(int)
    profile, big, sums = {}, {}, {}
    for batch, rows in enumerate(INPUT):
        p, b, s = [], [], []
        for r in rows:  # one key's elements in arrival order; keys are independent
            k = r["k"]
            count[k] += 1
            last[k] = (last[k] + [r["cat"]])[-3:]
            totals[k][r["cat"]] = totals[k].get(r["cat"], 0) + r["v"]
            p.append({"k": k, "grp": r["grp"], "count": count[k], "seq": r["seq"],
                      "total": totals[k][r["cat"]]})  # fmt: skip
            if r["v"] >= 10:
                b.append({"k": k, "v": r["v"]})
        for out in sorted(p, key=lambda o: o["seq"]):
            group_sum[out["grp"]] += out["count"]
            s.append({"grp": out["grp"], "seq": out["seq"], "sum": group_sum[out["grp"]]})
        profile[batch], big[batch], sums[batch] = sort_rows(p), sort_rows(b), sort_rows(s)
    final = {"count": count, "last": last, "totals": totals}
    return profile, big, sums, final


def test_chained_keyed_functions_and_side_outputs(spark: SparkSession, tmp_path: Path) -> None:
    def profile(frames: Any) -> Any:  # noqa: ANN401
        return key_by(frames["events"], "k").process(
            Profile(), PROFILE_OUT, side_outputs=[Profile.BIG]
        )

    def chained(frames: Any) -> Any:  # noqa: ANN401
        return key_by(profile(frames), "grp", order_by="seq").process(
            GroupSum(), "grp string, seq long, sum long"
        )

    jobs = {}
    for name, build in {
        "profile": profile,
        "big": lambda frames: side_output(profile(frames), Profile.BIG),
        "chained": chained,
    }.items():
        for label, job in on_keyedstate(build).items():
            jobs[f"{name}/{label}"] = job
    results = run_jobs(spark, tmp_path, {"events": SCHEMA}, PHASES, jobs)

    want_profile, want_big, want_sums, final = model()
    want = {"profile": want_profile, "big": want_big, "chained": want_sums}
    for job, result in results.items():
        name = job.split("/")[0]
        got = {b: rows for b, rows in result.batches.items() if rows or want[name].get(b)}
        assert got == {b: r for b, r in want[name].items() if r}, job

    for label in ("keyedstate",):
        checkpoint = results[f"chained/{label}"].checkpoint
        # Two stateful operators, one per keyed function, in plan order.
        metadata = spark.read.format("state-metadata").load(str(checkpoint)).collect()
        assert sorted((r["operatorId"], r["operatorName"]) for r in metadata) == [
            (1000, "keyedProcess"),
            (1001, "keyedProcess"),
        ], (label, metadata)
        # The state, typed, one row per key (per list element, per map entry).
        assert_profile_state(spark, results[f"profile/{label}"].checkpoint, final, label)


def assert_profile_state(spark: SparkSession, checkpoint: Path, final: dict, label: str) -> None:
    """``state.read`` returns Profile's final state (``model()``): a row per key, per list
    element, per map entry."""
    assert stored_state(spark, checkpoint, "count") == sorted(
        ({"k": k, "value": n} for k, n in final["count"].items()), key=repr
    ), label
    assert sorted((r["k"], r["value"]) for r in stored_state(spark, checkpoint, "last")) == sorted(
        (k, c) for k, cats in final["last"].items() for c in cats
    ), label
    assert stored_state(spark, checkpoint, "totals") == sorted(
        (
            {"k": k, "user_map_key": c, "value": t}
            for k, m in final["totals"].items()
            for c, t in m.items()
        ),
        key=repr,
    ), label


class Lifecycle(KeyedProcessFunction):
    """Records each task's open() and close() on the executors (one line per call)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def _record(self, what: str) -> None:
        context = TaskContext.get()
        if context is not None:  # not the driver's planning probe
            with open(self.log, "a") as out:
                out.write(f"{what} {context.stageId()} {context.partitionId()}\n")

    def open(self, runtime_context: RuntimeContext) -> None:
        self._record("open")

    def close(self) -> None:
        self._record("close")

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        yield value.k, value.v


def test_close_is_called_once_per_task_after_open(spark: SparkSession, tmp_path: Path) -> None:
    log = tmp_path / "lifecycle.log"
    jobs = on_keyedstate(
        lambda frames: key_by(frames["events"], "k").process(
            Lifecycle(str(log)), "k string, v long"
        )
    )
    results = run_jobs(spark, tmp_path, {"events": SCHEMA}, PHASES, jobs)
    for result in results.values():
        assert sum(len(rows) for rows in result.batches.values()) == sum(map(len, INPUT))
    lines = log.read_text().splitlines()
    opened = sorted(line.split(" ", 1)[1] for line in lines if line.startswith("open"))
    closed = sorted(line.split(" ", 1)[1] for line in lines if line.startswith("close"))
    assert opened and opened == closed, lines
    assert len(set(opened)) == len(opened), "open() ran more than once in a task"


class GroupNames(KeyedProcessFunction):
    """Names each element's group from a table shipped as a Spark broadcast variable, read in
    open(): such a variable loads only in executors (unpickling it on the driver fails)."""

    def __init__(self, names: Any) -> None:  # noqa: ANN401
        self.names = names
        self.opened: list[str] = []

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.table = self.names.value
        self.opened.append(runtime_context.get_task_name())

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield value.k, self.table[value.grp], count


def test_a_function_holding_a_spark_broadcast_variable_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    names = spark.sparkContext.broadcast({"g1": "first", "g2": "second", "g3": "third"})
    function = GroupNames(names)
    jobs = on_keyedstate(
        lambda frames: key_by(frames["events"], "k").process(
            function, "k string, name string, n long"
        )
    )
    results = run_jobs(spark, tmp_path, {"events": SCHEMA}, PHASES, jobs)
    table = {"g1": "first", "g2": "second", "g3": "third"}
    counts: dict[str, int] = defaultdict(int)
    expected = []
    for batch in INPUT:
        for row in batch:
            counts[row["k"]] += 1
            expected.append((row["k"], table[row["grp"]], counts[row["k"]]))
    for result in results.values():
        got = [(r["k"], r["name"], r["n"]) for rows in result.batches.values() for r in rows]
        assert sorted(got) == sorted(expected)
    # The planner ran open() on a copy: the function shipped, and the caller's, are untouched.
    assert function.opened == []


class TimedProfile(Profile):
    """Profile with an event-time timer per element (fires 3 s of event time later)."""

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        ctx.timer_service().register_event_time_timer(value.seq * 1000 + 3000)
        yield from super().process_element(value, ctx)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:  # noqa: ANN401
        yield ctx.get_current_key(), "timer", self.count.value(), timestamp, None


def run_phase(
    spark: SparkSession, source: FileInput, checkpoint: Path, provider: str
) -> tuple[dict[int, list[dict[str, Any]]], Any]:
    events = source.read_stream(spark).withColumn("ts", F.timestamp_seconds("seq"))
    frame = key_by(events.withWatermark("ts", "0 seconds"), "k").process(
        TimedProfile(), PROFILE_OUT, side_outputs=[Profile.BIG]
    )
    collector = BatchCollector()
    query = start_query(spark, provider, frame, "append", checkpoint, collector)
    await_finished(query)
    return collector.batches, query.lastProgress


def test_rescaled_python_api_checkpoint_continues_exactly(
    spark: SparkSession, tmp_path: Path
) -> None:
    """N=2 -> M=3 (new checkpoint) and 2 -> 1 (in place) after phase 1: phase 2's output equals a
    run that was never rescaled, the restarted query runs at M, and the state (values, list
    elements, map entries, timers) is the reference's, each row in pmod(hash(key), M)."""
    from keyedstate import rescale

    partitions_key = "spark.sql.shuffle.partitions"
    previous = spark.conf.get(partitions_key)
    spark.conf.set(partitions_key, "2")  # N (a new checkpoint pins the session's value)
    try:
        rescale_and_continue(spark, tmp_path, rescale)
    finally:
        spark.conf.set(partitions_key, previous)


def rescale_and_continue(spark: SparkSession, tmp_path: Path, rescale: Any) -> None:  # noqa: ANN401
    def source(name: str) -> FileInput:
        return FileInput(tmp_path / name / "input", SCHEMA)

    reference, line, in_place = source("reference"), source("line"), source("in-place")
    for phase in PHASES:
        for rows in phase["events"]:
            reference.add(rows)
        ref_batches, _ = run_phase(
            spark, reference, tmp_path / "reference/ckpt", PROVIDER_UNDER_TEST
        )
        if phase is PHASES[0]:
            for src, name in ((line, "line"), (in_place, "in-place")):
                for rows in phase["events"]:
                    src.add(rows)
                run_phase(spark, src, tmp_path / name / "ckpt", PROVIDER_UNDER_TEST)
            rescale(spark, str(tmp_path / "line/ckpt"), 3, output=str(tmp_path / "line/ckpt-3"))
            rescale(spark, str(tmp_path / "in-place/ckpt"), 1, in_place=True)
    targets = {"line": (tmp_path / "line/ckpt-3", 3), "in-place": (tmp_path / "in-place/ckpt", 1)}
    for name, src in (("line", line), ("in-place", in_place)):
        for rows in PHASES[1]["events"]:
            src.add(rows)
        checkpoint, partitions = targets[name]
        batches, progress = run_phase(spark, src, checkpoint, PROVIDER_UNDER_TEST)
        assert batches and batches == {b: ref_batches[b] for b in batches}, name
        assert progress["stateOperators"][0]["numShufflePartitions"] == partitions, name
        for state in ("count", "last", "totals", "$eventTimers"):
            want = stored_state(spark, tmp_path / "reference/ckpt", state)
            assert stored_state(spark, checkpoint, state) == want, (name, state)
            rows = keyedstate.state.read(spark, str(checkpoint), state=state)
            owner = F.pmod(F.hash(F.col("k")), F.lit(partitions))
            assert rows.where(owner != F.col("partition_id")).count() == 0, (name, state)


def test_checkpoint_format_v2(spark: SparkSession, tmp_path: Path) -> None:
    """With checkpoint format v2 (state store checkpoint ids in the commit log) the keyed
    function restarts exactly on both providers: its store reports the ids it committed, and
    ``state.read`` loads each partition by the id the last commit recorded."""
    key = "spark.sql.streaming.stateStore.checkpointFormatVersion"
    previous = spark.conf.get(key)
    spark.conf.set(key, "2")
    try:
        jobs = on_keyedstate(
            lambda frames: key_by(frames["events"], "k").process(
                Profile(), PROFILE_OUT, side_outputs=[Profile.BIG]
            )
        )
        results = run_jobs(spark, tmp_path, {"events": SCHEMA}, PHASES, jobs)
    finally:
        spark.conf.set(key, previous)
    want, _, _, final = model()
    for label, result in results.items():
        got = {b: rows for b, rows in result.batches.items() if rows}
        assert got == {b: r for b, r in want.items() if r}, label
        commits = sorted((result.checkpoint / "commits").glob("[0-9]*"))
        assert "stateUniqueIds" in commits[-1].read_text(), (label, commits[-1].read_text())
        assert_profile_state(spark, result.checkpoint, final, label)
    # inspect loads each store version by its id too: one RocksDB entry per key of the value and
    # the list state, one per map entry.
    report = keyedstate_inspect(spark, str(results["keyedstate"].checkpoint))
    entries = (
        len(final["count"])
        + sum(1 for cats in final["last"].values() if cats)
        + sum(len(m) for m in final["totals"].values())
    )
    assert [(o.operator_id, o.keys) for o in report.operators] == [(1000, entries)], report
