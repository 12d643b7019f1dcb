"""Keyed functions that run the same on a classic session and on Spark Connect: every kind of
state (one with TTL, one queryable), event-time timers, a side output, a chained keyed function,
operator state and broadcast state, each query writing Parquet files, in phases over one
checkpoint each (a phase restarts every query). ``run_phase`` takes a session of either kind:
the tests run it in their classic session and, through ``tests/support/drivers/connect_client.py``,
on a Spark Connect server; the Python workers get these classes by value."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyedstate
from keyedstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    FlatMapFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    OutputTag,
    ReducingStateDescriptor,
    RuntimeContext,
    StateTtlConfig,
    Time,
    Types,
    ValueStateDescriptor,
)
from pyspark.sql import DataFrame, SparkSession

from tests.support.keyed_functions import RULES, CountsProcessed, RuleMatches
from tests.support.state_api_support import ship_by_value

ship_by_value(__name__)

EVENTS = "k string, grp string, v long, ts timestamp"
RULE_CHANGES = "rule string, threshold long"
# Each phase: the events' files and the rules' files it adds (one file per micro-batch).
PHASES: list[dict[str, list[list[dict[str, Any]]]]] = [
    {
        "events": [
            [{"k": "a", "grp": "x", "v": 3, "ts": 1}, {"k": "b", "grp": "y", "v": 12, "ts": 2}],
            [{"k": "a", "grp": "x", "v": 7, "ts": 5}, {"k": "c", "grp": "x", "v": 1, "ts": 6}],
        ],
        "rules": [[{"rule": "big", "threshold": 10}], [{"rule": "any", "threshold": 0}]],
    },
    {
        "events": [
            [{"k": "b", "grp": "y", "v": 2, "ts": 20}, {"k": "a", "grp": "x", "v": 15, "ts": 21}],
            [{"k": "c", "grp": "x", "v": 9, "ts": 40}, {"k": "d", "grp": "y", "v": 4, "ts": 41}],
        ],
        "rules": [[{"rule": "big", "threshold": None}], []],
    },
]
QUERIES = ("kinds", "chained", "operator", "broadcast")


class Largest(AggregateFunction):
    def create_accumulator(self) -> int | None:
        return None

    def add(self, value: int, accumulator: int | None) -> int:
        return value if accumulator is None else max(value, accumulator)

    def get_result(self, accumulator: int | None) -> int | None:
        return accumulator

    def merge(self, a: int | None, b: int | None) -> int | None:
        return b if a is None else a if b is None else max(a, b)


class AllKinds(KeyedProcessFunction):
    """Per key, the five kinds of state: a count (value, with TTL, queryable as ``counts``),
    the values seen (list), a count per value's parity (map), their sum (reducing), the largest
    (aggregating); emits them per element, elements of v >= 10 to the side output ``big``, and
    per key an event-time timer 10 s after its first element, which emits ``(k, -1, ...)``."""

    BIG = OutputTag("big", Types.ROW_NAMED(["k", "v"], [Types.STRING(), Types.LONG()]))

    def open(self, runtime_context: RuntimeContext) -> None:
        count = ValueStateDescriptor("count", Types.LONG())
        count.enable_time_to_live(StateTtlConfig.new_builder(Time.hours(1)).build())
        count.set_queryable("counts")
        self.count = runtime_context.get_state(count)
        self.seen = runtime_context.get_list_state(ListStateDescriptor("seen", Types.LONG()))
        self.parity = runtime_context.get_map_state(
            MapStateDescriptor("parity", Types.STRING(), Types.LONG())
        )
        self.total = runtime_context.get_reducing_state(
            ReducingStateDescriptor("total", lambda a, b: a + b, Types.LONG())
        )
        self.largest = runtime_context.get_aggregating_state(
            AggregatingStateDescriptor("largest", Largest(), Types.LONG())
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[tuple]:  # noqa: ANN401
        count = (self.count.value() or 0) + 1
        if count == 1:
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 10_000)
        self.count.update(count)
        self.seen.add(value.v)
        parity = "even" if value.v % 2 == 0 else "odd"
        self.parity.put(parity, (self.parity.get(parity) or 0) + 1)
        self.total.add(value.v)
        self.largest.add(value.v)
        if value.v >= 10:
            ctx.output(self.BIG, (value.k, value.v))
        yield self.row(value.k, count)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[tuple]:
        yield self.row(ctx.get_current_key(), -1)

    def row(self, key: str, count: int) -> tuple:
        parities = json.dumps(dict(sorted(self.parity.items())))
        return key, count, list(self.seen.get()), parities, self.total.get(), self.largest.get()


KINDS_OUT = "k string, count long, seen array<long>, parities string, total long, largest long"


class GroupCount(KeyedProcessFunction):
    """Downstream of AllKinds, keyed by the key it emitted: the rows it saw per key."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.rows = runtime_context.get_state(ValueStateDescriptor("rows", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[tuple]:  # noqa: ANN401
        rows = (self.rows.value() or 0) + 1
        self.rows.update(rows)
        yield value.k, value.count, rows


class CountedPassThrough(FlatMapFunction, CountsProcessed):
    """Operator state: passes each element on, counting them in the partition's operator state."""

    def flat_map(self, value: Any) -> Iterator[tuple]:  # noqa: ANN401
        self.processed += 1
        yield value.k, value.v


def write_inputs(root: Path, phase: int) -> None:
    """The phase's input files (JSON lines; ``ts`` in seconds since the epoch), each published by
    a rename."""
    for source, files in PHASES[phase].items():
        folder = root / "input" / source
        folder.mkdir(parents=True, exist_ok=True)
        done = len(list(folder.glob("*.json")))
        for n, rows in enumerate(files):
            tmp = folder / f".{done + n:04d}.tmp"
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            # Spark's file source takes files in modification-time order: one second apart.
            os.utime(tmp, (1_700_000_000 + done + n, 1_700_000_000 + done + n))
            tmp.rename(folder / f"{done + n:04d}.json")


def _stream(spark: SparkSession, root: Path, source: str, schema: str) -> DataFrame:
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(root / "input" / source))
    )


def queries(spark: SparkSession, root: Path) -> dict[str, DataFrame]:
    """Each query's output, by name (QUERIES)."""
    events = _stream(spark, root, "events", EVENTS).withWatermark("ts", "0 seconds")
    kinds = keyedstate.key_by(events, "k").process(
        AllKinds(), KINDS_OUT, uid="kinds", side_outputs=[AllKinds.BIG]
    )
    chained = keyedstate.key_by(kinds, "k").process(
        GroupCount(), "k string, count long, rows long", uid="chained"
    )
    operator = keyedstate.key_by(_stream(spark, root, "events", EVENTS), "k").flat_map(
        CountedPassThrough(), "k string, v long", uid="operator"
    )
    rules = keyedstate.broadcast(_stream(spark, root, "rules", RULE_CHANGES), RULES)
    broadcast = (
        keyedstate.key_by(
            _stream(spark, root, "events", EVENTS)
            .withColumnRenamed("k", "user")
            .withColumnRenamed("v", "amount"),
            "user",
        )
        .connect(rules)
        .process(RuleMatches(), "user string, amount long, rule string, n long", uid="matches")
    )
    return {
        # Every output of one run: the main rows, and the side output's with their tag.
        "kinds": keyedstate.side_output(kinds, None),
        "chained": chained,
        "operator": operator,
        "broadcast": broadcast,
    }


def run_phase(spark: SparkSession, root: Path) -> None:
    """One phase: every query started on its checkpoint (availableNow) and awaited."""
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", keyedstate.PROVIDER_CLASS)
    frames = queries(spark, root)
    for name in QUERIES:
        query = (
            frames[name]
            .writeStream.format("parquet")
            .option("path", str(root / "output" / name))
            .option("checkpointLocation", str(root / "checkpoint" / name))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()


def outputs(root: Path) -> dict[str, list[tuple]]:
    """Every query's rows so far, sorted (read with pyarrow, without Spark)."""
    import pyarrow.parquet as pq

    found = {}
    for name in QUERIES:
        folder = root / "output" / name
        files = sorted(folder.glob("*.parquet")) if folder.exists() else []
        rows = [tuple(r.values()) for f in files for r in pq.read_table(f).to_pylist()]
        found[name] = sorted(rows, key=repr)
    return found


def run_operations(spark: SparkSession, root: Path) -> dict[str, Any]:
    """The offline operations on the ``kinds`` query's checkpoint (its query stopped): the state
    read, inspected, a native savepoint taken, inspected, listed, restored at 3 partitions,
    transformed and disposed of, the checkpoint rescaled to 3, a savepoint bootstrapped, a
    running query stopped with a savepoint, and a missing checkpoint refused. What each gives,
    without the paths (which differ per run)."""
    from keyedstate.errors import CheckpointOperationError

    checkpoint = str(root / "checkpoint" / "kinds")
    rows = keyedstate.state.read(spark, checkpoint, "kinds", "count").collect()
    counts = sorted((r["k"], r["value"]) for r in rows)
    report = keyedstate.inspect(spark, checkpoint)
    operators = sorted((o.operator_id, o.uid, o.keys) for o in report.operators)
    savepoints = root / "savepoints"
    taken = keyedstate.savepoint(spark, checkpoint, str(savepoints / "sp-1"), format="native")
    inspected = keyedstate.inspect_savepoint(spark, str(savepoints / "sp-1"), verify=True)
    listed = [Path(i.path).name for i in keyedstate.list_savepoints(spark, str(savepoints))]
    restored = keyedstate.restore_savepoint(
        spark, str(savepoints / "sp-1"), str(root / "restored"), partitions=3
    )
    restored_counts = sorted(
        (r["k"], r["value"])
        for r in keyedstate.state.read(spark, str(root / "restored"), "kinds", "count").collect()
    )
    rescaled = keyedstate.rescale(spark, checkpoint, 3, output=str(root / "rescaled"))
    # The state processor API: a savepoint changed (counts times 10, the list state dropped) and
    # one bootstrapped from a static DataFrame by the chained query's function.
    from pyspark.sql import functions as F

    changed = keyedstate.state.transform(
        spark,
        str(savepoints / "sp-1"),
        str(savepoints / "sp-changed"),
        map_states={("kinds", "count"): lambda df: df.withColumn("value", F.col("value") * 10)},
        drop=[("kinds", "seen")],
    )
    changed_counts = sorted(
        (r["k"], r["value"])
        for r in keyedstate.state.read(
            spark, str(savepoints / "sp-changed"), "kinds", "count"
        ).collect()
    )
    history = spark.createDataFrame([("a", 1), ("a", 1), ("e", 1)], "k string, count long")
    boot = keyedstate.state.bootstrap(
        spark,
        history,
        lambda stream: keyedstate.key_by(stream, "k").process(
            GroupCount(), "k string, count long, rows long", uid="chained"
        ),
        str(savepoints / "sp-boot"),
    )
    booted = keyedstate.state.read(spark, str(savepoints / "sp-boot"), "chained", "rows")
    booted_rows = sorted((r["k"], r["value"]) for r in booted.collect())
    disposed = keyedstate.dispose_savepoint(spark, str(savepoints / "sp-1"))
    # A running query stopped with a savepoint: the chained query, on new input it waits for.
    query = (
        queries(spark, root)["chained"]
        .writeStream.format("noop")
        .option("checkpointLocation", str(root / "checkpoint" / "chained"))
        .start()
    )
    query.processAllAvailable()
    stopped = keyedstate.stop_with_savepoint(query, str(savepoints / "sp-stop"))
    refused = []
    for refusal in (
        lambda: keyedstate.inspect(spark, str(root / "missing")),  # an IllegalArgumentException
        lambda: keyedstate.rescale(spark, checkpoint, 2),  # the count it has: IllegalStateException
        lambda: keyedstate.state.read(spark, checkpoint, "kinds", "nothing"),
    ):
        try:
            refusal()
            refused.append(None)
        except CheckpointOperationError as error:
            refused.append([type(error).__name__, error.error_id])
    return {
        "counts": counts,
        "inspect": [report.batch_id, report.partitions, operators],
        "savepoint": [taken.batch_id, taken.partitions, taken.format, inspected.batch_id],
        "listed": listed,
        "restored": [restored.batch_id, restored.to_partitions, restored_counts],
        "rescaled": [rescaled.from_partitions, rescaled.to_partitions, rescaled.keys],
        "disposed": disposed.batch_id,
        "transformed": [
            changed.format,
            sorted(t.state for o in changed.operators for t in o.tables),
            changed_counts,
        ],
        "bootstrapped": [boot.format, sorted(o.uid for o in boot.operators), booted_rows],
        "stopped": [stopped.batch_id, sorted(o.uid for o in stopped.operators), query.isActive],
        "refused": refused,
    }
