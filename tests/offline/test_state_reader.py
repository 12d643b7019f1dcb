"""``keyedstate.state.read`` on checkpoints written by keyedstate's provider.

Spark's own stateful operators (a streaming aggregation, dropDuplicates,
applyInPandasWithState, a session window aggregation, a stream-stream join's four stores) are
read as Spark's ``statestore`` reader reads them, at every committed batch, and as a model of
the input says. A keyed function's value, list and map state, its timers and its operator state
are read at every committed batch as a model of the input says, flattened or not; an uncommitted
batch, an unknown uid, operator id or state, and an ambiguous read are refused naming what the
checkpoint holds; a native savepoint reads as the checkpoint it was taken of.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import keyedstate
import pandas as pd
import pytest
from keyedstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    key_by,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.keyed_functions import CountsProcessed
from tests.support.state_api_support import batch_metadata, on_keyedstate, run_jobs, ship_by_value
from tests.support.streaming_harness import committed_batches

Rows = list[dict[str, Any]]

# ---------------------------------------------------------------------------------------------
# Helpers


def canonical_dicts(rows: Any) -> list[dict[str, Any]]:  # noqa: ANN401 - an iterable of dicts
    """Dicts in an order that depends on their content only (not on their keys' order)."""
    return sorted(rows, key=lambda d: repr(sorted(d.items())))


def canonical(frame: DataFrame) -> list[dict[str, Any]]:
    """A DataFrame's rows as plain dicts (structs as dicts too), in a stable order."""
    return canonical_dicts(r.asDict(recursive=True) for r in frame.collect())


def read(spark: SparkSession, path: Path, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    return canonical(keyedstate.state.read(spark, str(path), *args, **kwargs))


def spark_store(
    spark: SparkSession, checkpoint: Path, operator: int, store: str, batch_id: int | None = None
) -> list[dict[str, Any]]:
    """The rows of one store, by Spark's own ``statestore`` reader."""
    reader = (
        spark.read.format("statestore")
        .option("operatorId", operator)
        .option("storeName", store)
    )
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return canonical(reader.load(str(checkpoint)).select("partition_id", "key", "value"))


def files_through(checkpoint: Path) -> dict[int, int]:
    """``committed batch -> number of input files it had read`` (the file source's offset in
    the offset log; a no-data batch repeats its predecessor's)."""
    out = {}
    for batch in committed_batches(checkpoint):
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        offsets = [line for line in lines if line.startswith('{"logOffset"')]
        assert len(offsets) == 1, lines
        out[batch] = int(offsets[0].split(":")[1].rstrip("}")) + 1
    return out


def partition_of(spark: SparkSession, keys: list[str]) -> dict[str, int]:
    """Each key's state partition, as Spark's hash partitioning (2 shuffle partitions) puts it."""
    frame = spark.createDataFrame([(k,) for k in keys], "k string")
    return {r.k: r.p for r in frame.select("k", F.expr("pmod(hash(k), 2)").alias("p")).collect()}


def the_checkpoint(results: Mapping[str, Any]) -> Path:
    (result,) = results.values()
    return result.checkpoint


# ---------------------------------------------------------------------------------------------
# Spark's own operators on keyedstate's provider

EVENTS = StructType(
    [
        StructField("key", StringType()),
        StructField("id", LongType()),
        StructField("v", LongType()),
        StructField("t", LongType()),
    ]
)
WATERMARK_S = 5
SESSION_GAP_MS = 3500  # never a whole second: no session ends at a watermark


def event_files(seed: int, n_files: int = 4, rows: int = 8) -> list[Rows]:
    """File i has event times in 100 + [6i, 6i + 7]: no row is behind the watermark (the
    previous files' latest time - 5 s); ids repeat (dropDuplicates drops them)."""
    rng = random.Random(seed)
    return [
        [
            {
                "key": f"k{rng.randrange(5)}",
                "id": rng.randrange(6),
                "v": rng.randrange(1, 50),
                "t": 100 + 6 * i + rng.randrange(8),
            }
            for _ in range(rows)
        ]
        for i in range(n_files)
    ]


FILES = event_files(seed=7)
RIGHT_FILES = event_files(seed=8)
PHASES = [{"events": FILES[:2]}, {"events": FILES[2:]}]


def aggregation(frames: Mapping[str, DataFrame]) -> DataFrame:
    return frames["events"].groupBy("key").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))


def deduplication(frames: Mapping[str, DataFrame]) -> DataFrame:
    return frames["events"].dropDuplicates(["key", "id"])


def pandas_state(frames: Mapping[str, DataFrame]) -> DataFrame:
    def running(key: tuple, pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[Any]:
        cnt, total = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            cnt += len(pdf)
            total += int(pdf["v"].sum())
        state.update((cnt, total))
        yield pd.DataFrame({"key": [key[0]], "cnt": [cnt], "total": [total]})

    return (
        frames["events"]
        .groupBy("key")
        .applyInPandasWithState(
            running,
            outputStructType="key string, cnt long, total long",
            stateStructType="cnt long, total long",
            outputMode="update",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    )


def sessions(frames: Mapping[str, DataFrame]) -> DataFrame:
    events = frames["events"].withColumn("ts", F.timestamp_seconds("t"))
    return (
        events.withWatermark("ts", f"{WATERMARK_S} seconds")
        .groupBy(F.session_window("ts", f"{SESSION_GAP_MS} milliseconds"), "key")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))
    )


def join(frames: Mapping[str, DataFrame]) -> DataFrame:
    def side(frame: DataFrame, p: str) -> DataFrame:
        return frame.select(
            F.col("key").alias(f"{p}key"),
            F.col("id").alias(f"{p}id"),
            F.timestamp_seconds("t").alias(f"{p}ts"),
        ).withWatermark(f"{p}ts", "10 seconds")

    condition = F.expr(
        "lkey = rkey AND rts >= lts - interval 5 seconds AND rts <= lts + interval 5 seconds"
    )
    return side(frames["left"], "l").join(side(frames["right"], "r"), condition, "inner")


JOIN_STORES = [
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
]


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One checkpoint per operator, each written by keyedstate's provider."""
    root = tmp_path_factory.mktemp("spark-operators")
    scenarios = {
        "aggregation": (aggregation, "update", PHASES),
        "dedup": (deduplication, "append", [{"events": FILES}]),
        "pandas": (pandas_state, "update", [{"events": FILES}]),
        "sessions": (sessions, "append", [{"events": FILES}]),
    }
    out = {}
    for name, (build, mode, phases) in scenarios.items():
        sources = {"events": EVENTS}
        results = run_jobs(spark, root / name, sources, phases, on_keyedstate(build), mode)
        out[name] = the_checkpoint(results)
    results = run_jobs(
        spark,
        root / "join",
        {"left": EVENTS, "right": EVENTS},
        [{"left": FILES, "right": RIGHT_FILES}],
        on_keyedstate(join),
        "append",
    )
    out["join"] = the_checkpoint(results)
    return out


def assert_reads_as_spark(spark: SparkSession, checkpoint: Path, store: str) -> None:
    """At every committed batch, the store's rows are Spark's reader's."""
    for batch in committed_batches(checkpoint):
        ours = read(spark, checkpoint, 0, store, batch_id=batch)
        assert ours == spark_store(spark, checkpoint, 0, store, batch), (store, batch)


def test_a_streaming_aggregation_reads_as_spark_and_the_input_say(
    spark: SparkSession, spark_runs: dict[str, Path]
) -> None:
    checkpoint = spark_runs["aggregation"]
    assert_reads_as_spark(spark, checkpoint, "default")
    # Its only store, by name or without one; across the restart too (one batch per file).
    batches = committed_batches(checkpoint)
    assert batches == list(range(len(FILES)))
    keys = sorted({r["key"] for rows in FILES for r in rows})
    partition = partition_of(spark, keys)
    for batch in batches:
        count: Counter[str] = Counter()
        total: Counter[str] = Counter()
        for row in (r for rows in FILES[: batch + 1] for r in rows):
            count[row["key"]] += 1
            total[row["key"]] += row["v"]
        want = canonical_dicts(
            {"partition_id": partition[k], "key": {"key": k}, "value": {"count": n, "sum": s}}
            for k, n, s in ((k, count[k], total[k]) for k in count)
        )
        assert read(spark, checkpoint, 0, "default", batch_id=batch) == want, batch
    assert read(spark, checkpoint) == read(spark, checkpoint, batch_id=batches[-1])
    assert read(spark, checkpoint) == read(spark, checkpoint, "0", "default")


def test_drop_duplicates_reads_as_spark_and_the_input_say(
    spark: SparkSession, spark_runs: dict[str, Path]
) -> None:
    checkpoint = spark_runs["dedup"]
    assert_reads_as_spark(spark, checkpoint, "default")
    rows = read(spark, checkpoint)
    # No watermark: every distinct (key, id) stays, once.
    want = {(r["key"], r["id"]) for rows in FILES for r in rows}
    stored = [(r["key"]["key"], r["key"]["id"]) for r in rows]
    assert sorted(stored) == sorted(want)
    assert all(r["value"] == {"__dummy__": None} for r in rows)


def test_apply_in_pandas_with_state_reads_as_spark_and_the_input_say(
    spark: SparkSession, spark_runs: dict[str, Path]
) -> None:
    checkpoint = spark_runs["pandas"]
    assert_reads_as_spark(spark, checkpoint, "default")
    want: dict[str, dict[str, int]] = defaultdict(lambda: {"cnt": 0, "total": 0})
    for row in (r for rows in FILES for r in rows):
        want[row["key"]]["cnt"] += 1
        want[row["key"]]["total"] += row["v"]
    got = {r["key"]["key"]: r["value"]["groupState"] for r in read(spark, checkpoint)}
    assert got == want


def python_sessions(rows: Rows, gap_ms: int) -> set[tuple[str, int, int, int, int]]:
    """``(key, start ms, end ms, count, sum)`` of each session window over ``rows``."""
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_key[row["key"]].append(row)
    out = set()
    for key, events in by_key.items():
        events.sort(key=lambda r: r["t"])
        current: list[int] | None = None
        for event in events:
            at = event["t"] * 1000
            if current is not None and at < current[1]:
                current = [current[0], at + gap_ms, current[2] + 1, current[3] + event["v"]]
            else:
                if current is not None:
                    out.add((key, *current))
                current = [at, at + gap_ms, 1, event["v"]]
        if current is not None:
            out.add((key, *current))
    return out  # type: ignore[return-value]


def test_a_session_window_aggregation_reads_as_spark_and_the_input_say(
    spark: SparkSession, spark_runs: dict[str, Path]
) -> None:
    checkpoint = spark_runs["sessions"]
    assert_reads_as_spark(spark, checkpoint, "default")
    # Stored: the sessions the last batch's watermark has not closed yet (typed as timestamps).
    frame = keyedstate.state.read(spark, str(checkpoint))
    stored = {
        (r.k, r.start, r.end, r.n, r.s)
        for r in frame.select(
            F.col("key.key").alias("k"),
            F.unix_millis("value.session_window.start").alias("start"),
            F.unix_millis("value.session_window.end").alias("end"),
            F.col("value.count").alias("n"),
            F.col("value.sum").alias("s"),
        ).collect()
    }
    watermark_ms, _ = batch_metadata(checkpoint)[committed_batches(checkpoint)[-1]]
    everything = python_sessions([r for rows in FILES for r in rows], SESSION_GAP_MS)
    open_sessions = {s for s in everything if s[2] > watermark_ms}
    assert stored == open_sessions and stored


def test_a_stream_stream_joins_four_stores_read_as_spark_says(
    spark: SparkSession, spark_runs: dict[str, Path]
) -> None:
    checkpoint = spark_runs["join"]
    for store in JOIN_STORES:
        assert_reads_as_spark(spark, checkpoint, store)
    for side, p, files in (("left", "l", FILES), ("right", "r", RIGHT_FILES)):
        counts = read(spark, checkpoint, 0, f"{side}-keyToNumValues")
        values = read(spark, checkpoint, 0, f"{side}-keyWithIndexToValue")
        assert values, side
        # Each key's count is its number of stored values, indexed 0..n-1 in its partition.
        per_key: dict[tuple[int, str], list[int]] = defaultdict(list)
        for r in values:
            per_key[(r["partition_id"], r["key"]["field0"])].append(r["key"]["index"])
        assert {k: sorted(v) for k, v in per_key.items()} == {
            (r["partition_id"], r["key"]["field0"]): list(range(r["value"]["value"]))
            for r in counts
        }, side
        # Every stored value is an input row of its side (no more often than it came).
        inputs = Counter((r["key"], r["id"], r["t"]) for rows in files for r in rows)
        stored = Counter(
            (r["value"][f"{p}key"], r["value"][f"{p}id"], int(r["value"][f"{p}ts"].timestamp()))
            for r in values
        )
        assert not stored - inputs, (side, stored - inputs)


# ---------------------------------------------------------------------------------------------
# A keyed function's state

LEDGER_INPUT = StructType(
    [
        StructField("key", StringType()),
        StructField("cat", StringType()),
        StructField("v", LongType()),
        StructField("t", LongType()),
        StructField("seq", LongType()),
    ]
)
KEEP = 4  # list elements kept per key
TIMER_DELAY_MS = 12_500  # never a whole second: no timer is ever at a watermark


class Ledger(KeyedProcessFunction, CountsProcessed):
    """Per key: a count, the last KEEP values in arrival order, a total per category, an
    event-time timer 12.5 s after each element, and how many of its timers fired; per
    partition (operator state): the number of elements it processed."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.fired = runtime_context.get_state(ValueStateDescriptor("fired", Types.LONG()))
        self.items = runtime_context.get_list_state(ListStateDescriptor("items", Types.LONG()))
        self.totals = runtime_context.get_map_state(
            MapStateDescriptor("totals", Types.STRING(), Types.LONG())
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        self.processed += 1
        self.count.update((self.count.value() or 0) + 1)
        self.items.add(value.v)
        items = list(self.items.get())
        if len(items) > KEEP:
            self.items.update(items[-KEEP:])
        self.totals.put(value.cat, (self.totals.get(value.cat) or 0) + value.v)
        ctx.timer_service().register_event_time_timer(value.t * 1000 + TIMER_DELAY_MS)
        yield (value.key, value.v)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:  # noqa: ANN401
        self.fired.update((self.fired.value() or 0) + 1)
        yield from ()


class Tail(KeyedProcessFunction):
    """Downstream of Ledger: counts its outputs per key."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        yield (value.key, n)


ship_by_value(__name__)

LEDGER_KEYS = ["a", "b", "c", "d", "e"]


def ledger_files() -> list[Rows]:
    """Every file has every key (both partitions process elements in every batch), in shuffled
    order, with values that are not in order; file i has event times in 100 + [10i, 10i + 6]."""
    rng = random.Random(3)
    files, seq = [], 0
    for i in range(5):
        keys = [*LEDGER_KEYS, *rng.sample(LEDGER_KEYS, 3)]
        rng.shuffle(keys)
        rows = []
        for key in keys:
            rows.append(
                {
                    "key": key,
                    "cat": rng.choice("xyz"),
                    "v": rng.randrange(100),
                    "t": 100 + 10 * i + rng.randrange(7),
                    "seq": seq,
                }
            )
            seq += 1
        files.append(rows)
    return files


LEDGER_FILES = ledger_files()


def ledger_query(frames: Mapping[str, DataFrame]) -> DataFrame:
    events = frames["events"].withColumn("ts", F.timestamp_seconds("t"))
    events = events.withWatermark("ts", f"{WATERMARK_S} seconds")
    ledger = key_by(events, "key", order_by="seq").process(
        Ledger(), "key string, v long", uid="ledger"
    )
    return key_by(ledger, "key").process(Tail(), "key string, n long", uid="tail")


@pytest.fixture(scope="module")
def ledger(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two keyed functions' checkpoint: three files, a restart, two more."""
    results = run_jobs(
        spark,
        tmp_path_factory.mktemp("ledger"),
        {"events": LEDGER_INPUT},
        [{"events": LEDGER_FILES[:3]}, {"events": LEDGER_FILES[3:]}],
        on_keyedstate(ledger_query),
    )
    return the_checkpoint(results)


def ledger_model(files: list[Rows], watermark_ms: int, partition: dict[str, int]) -> dict:
    """The rows (flatten=False, without partition_id) each state should hold after ``files``
    at a batch of that watermark, and per partition the operator state."""
    count: Counter[str] = Counter()
    items: dict[str, list[int]] = defaultdict(list)
    totals: dict[str, dict[str, int]] = defaultdict(dict)
    timers: set[tuple[str, int]] = set()
    for row in (r for rows in files for r in sorted(rows, key=lambda r: r["seq"])):
        key = row["key"]
        count[key] += 1
        items[key] = [*items[key], row["v"]][-KEEP:]
        totals[key][row["cat"]] = totals[key].get(row["cat"], 0) + row["v"]
        timers.add((key, row["t"] * 1000 + TIMER_DELAY_MS))
    fired = Counter(k for k, at in timers if at <= watermark_ms)
    processed: Counter[int] = Counter()
    for key, n in count.items():
        processed[partition[key]] += n
    return {
        "count": [{"key": k, "value": n} for k, n in count.items()],
        "fired": [{"key": k, "value": n} for k, n in fired.items()],
        "items": [{"key": k, "value": v} for k, v in items.items()],
        "totals": [{"key": k, "value": v} for k, v in totals.items()],
        "$eventTimers": [{"timestamp": at, "key": k} for k, at in timers if at > watermark_ms],
        "$procTimers": [],
        "processed": [{"partition_id": p, "value": [n]} for p, n in processed.items()],
    }


KEYED_STATES = ["count", "fired", "items", "totals", "$eventTimers", "$procTimers"]


def flattened(state: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """flatten=False rows as flatten=True gives them: a row per list element or map entry."""
    out = []
    for row in rows:
        if state in ("items", "processed"):
            out += [{**row, "value": element} for element in row["value"]]
        elif state == "totals":
            out += [{**row, "user_map_key": k, "value": v} for k, v in row["value"].items()]
        else:
            out.append(row)
    return canonical_dicts(out)


def test_a_keyed_functions_states_read_as_the_input_says_at_every_batch(
    spark: SparkSession, ledger: Path
) -> None:
    partition = partition_of(spark, LEDGER_KEYS)
    assert set(partition.values()) == {0, 1}
    watermarks = {b: wm for b, (wm, _) in batch_metadata(ledger).items()}
    through = files_through(ledger)
    # Five files, and no-data batches that only advanced the watermark (firing timers).
    assert sorted(set(through.values())) == [1, 2, 3, 4, 5] and len(through) > 5
    previous = None
    for batch, n_files in through.items():
        model = ledger_model(LEDGER_FILES[:n_files], watermarks[batch], partition)
        got = {}
        for state in [*KEYED_STATES, "processed"]:
            nested = read(spark, ledger, "ledger", state, batch_id=batch, flatten=False)
            flat = read(spark, ledger, "ledger", state, batch_id=batch)
            assert flat == flattened(state, nested), (batch, state)
            if state != "processed":
                # Each key's rows are in its partition, Spark's hash partitioning's.
                assert all(r["partition_id"] == partition[r["key"]] for r in nested), state
                nested = canonical_dicts(
                    {k: v for k, v in r.items() if k != "partition_id"} for r in nested
                )
            got[state] = nested
        want = {state: canonical_dicts(rows) for state, rows in model.items()}
        assert got == want, batch  # lists compared in order: arrival order within a key
        if previous is not None and through[batch - 1] != n_files:
            assert got != previous, batch
        previous = got
    # The data exercise what is compared: fired and pending timers, lists not in value order.
    last = committed_batches(ledger)[-1]
    final = ledger_model(LEDGER_FILES, watermarks[last], partition)
    assert final["fired"] and final["$eventTimers"]
    assert any(r["value"] != sorted(r["value"]) for r in final["items"])
    # The downstream function: by uid, by operator id, and as its only state.
    outputs = Counter(r["key"] for rows in LEDGER_FILES for r in rows)
    tail = [{"key": k, "value": n} for k, n in outputs.items()]
    stored_tail = [{k: r[k] for k in ("key", "value")} for r in read(spark, ledger, "tail")]
    assert canonical_dicts(stored_tail) == canonical_dicts(tail)
    assert read(spark, ledger, "tail") == read(spark, ledger, 1001, "n", batch_id=last)
    assert read(spark, ledger, "ledger", "count") == read(spark, ledger, 1000, "count")


def test_batch_ids_read_that_batchs_state_and_an_uncommitted_one_is_refused(
    spark: SparkSession, ledger: Path, tmp_path: Path
) -> None:
    through = files_through(ledger)
    assert (through[0], through[1]) == (1, 2)
    partition = partition_of(spark, LEDGER_KEYS)
    for batch in (0, 1):
        model = ledger_model(LEDGER_FILES[: through[batch]], 0, partition)
        got = read(spark, ledger, "ledger", "items", batch_id=batch, flatten=False)
        assert canonical_dicts({"key": r["key"], "value": r["value"]} for r in got) == (
            canonical_dicts(model["items"])
        )
    batch0 = read(spark, ledger, "ledger", "count", batch_id=0)
    assert batch0 != read(spark, ledger, "ledger", "count", batch_id=1)
    assert sum(r["value"] for r in batch0) == len(LEDGER_FILES[0])

    last = committed_batches(ledger)[-1]
    with pytest.raises(keyedstate.QueryCheckpointError) as refused:
        read(spark, ledger, "ledger", "count", batch_id=last + 1)
    message = str(refused.value)
    assert f"batch {last + 1} of " in message and "is not committed" in message, message
    assert f"its commit log holds batches 0 to {last}" in message, message

    # A batch planned but not committed (its commit removed): refused, and the last read is
    # the one before it.
    copy = tmp_path / "checkpoint"
    shutil.copytree(ledger, copy)
    for name in (str(last), f".{last}.crc"):
        (copy / "commits" / name).unlink(missing_ok=True)
    with pytest.raises(keyedstate.QueryCheckpointError, match=f"batch {last} of .* not committed"):
        read(spark, copy, "ledger", "fired", batch_id=last)
    for state in ("count", "fired", "$eventTimers"):
        assert read(spark, copy, "ledger", state) == read(
            spark, ledger, "ledger", state, batch_id=last - 1
        ), state


def test_unknown_operators_and_states_and_ambiguous_reads_are_refused_naming_what_exists(
    spark: SparkSession, ledger: Path, spark_runs: dict[str, Path]
) -> None:
    ledger_states = (
        "operator 1000: keyed function Ledger (uid 'ledger'), states 'count', 'fired', 'items', "
        "'totals', 'processed', '$eventTimers', '$procTimers'"
    )
    tail_states = "operator 1001: keyed function Tail (uid 'tail'), states 'n'"

    def refusal(path: Path, *args: Any, **kwargs: Any) -> str:
        with pytest.raises(keyedstate.QueryCheckpointError) as refused:
            keyedstate.state.read(spark, str(path), *args, **kwargs)
        return str(refused.value)

    message = refusal(ledger, "nope", "count")
    assert "has no keyed function with uid 'nope'; its operators:" in message, message
    assert f"{ledger_states}; {tail_states}" in message, message
    message = refusal(ledger, 1002, "count")
    assert "has no stateful operator 1002; its operators:" in message, message
    assert f"{ledger_states}; {tail_states}" in message, message
    message = refusal(ledger, "ledger", "nope")
    assert ledger_states in message and "has no state 'nope'" in message, message
    message = refusal(ledger, state="count")
    assert f"has several stateful operators ({ledger_states}; {tail_states})" in message, message
    assert "name one by uid or operator id" in message, message
    message = refusal(ledger, "ledger")
    assert ledger_states in message and "has several states; name one" in message, message

    join_stores = (
        "operator 0: symmetricHashJoin, stores "
        + ", ".join(f"'{s}'" for s in JOIN_STORES)
    )
    message = refusal(spark_runs["join"])
    assert join_stores in message and "has several states; name one" in message, message
    message = refusal(spark_runs["join"], 0, "left")
    assert join_stores in message and "has no state 'left'" in message, message
    message = refusal(spark_runs["join"], 1, "left-keyToNumValues")
    assert f"has no stateful operator 1; its operators: {join_stores}" in message, message
    message = refusal(spark_runs["aggregation"], "counts")
    assert "has no keyed function with uid 'counts'; its operators: operator 0: " in message
    assert "stores 'default'" in message, message

    with pytest.raises(TypeError, match="batch_id must be an int"):
        keyedstate.state.read(spark, str(ledger), "ledger", "count", batch_id=True)


def test_a_savepoint_reads_as_its_checkpoint(
    spark: SparkSession, ledger: Path, spark_runs: dict[str, Path], tmp_path: Path
) -> None:
    target = tmp_path / "ledger-savepoint"
    info = keyedstate.savepoint(spark, str(ledger), str(target))
    assert info.batch_id == committed_batches(ledger)[-1]
    for state in [*KEYED_STATES, "processed"]:
        for flatten in (True, False):
            got = read(spark, target, "ledger", state, flatten=flatten)
            assert got == read(spark, ledger, "ledger", state, flatten=flatten), (state, flatten)
            assert got == read(
                spark, target, 1000, state, batch_id=info.batch_id, flatten=flatten
            ), (state, flatten)
    assert read(spark, target, "tail") == read(spark, ledger, "tail")
    assert read(spark, target, "ledger", "items")

    join_target = tmp_path / "join-savepoint"
    keyedstate.savepoint(spark, str(spark_runs["join"]), str(join_target))
    for store in JOIN_STORES:
        got = read(spark, join_target, 0, store)
        assert got == read(spark, spark_runs["join"], 0, store), store
