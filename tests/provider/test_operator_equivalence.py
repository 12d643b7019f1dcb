"""Each stateful operator gives the same per-batch output on our provider as on Spark's RocksDB.

Each scenario runs one query in two phases over one checkpoint: phase 1 processes some input files
and stops; phase 2 adds more files and restarts the query from the checkpoint (so the provider
must reload the state it committed). The per-batch outputs of the provider under test must equal
those of the reference provider exactly, and a few values are checked against results computed
here in plain Python, so two providers producing the same garbage cannot pass.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    REFERENCE_PROVIDER,
    RunResult,
    diff_batches,
    rows_of,
    run_phases,
    sort_rows,
)

Rows = list[dict[str, Any]]
Batches = dict[int, Rows]

EVENT_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("id", LongType()),
        StructField("v", LongType()),
        StructField("t", LongType()),  # event time, epoch seconds
    ]
)
LEFT_SCHEMA = StructType(
    [
        StructField("lkey", StringType()),
        StructField("lid", LongType()),
        StructField("lv", LongType()),
        StructField("lt", LongType()),
    ]
)
RIGHT_SCHEMA = StructType(
    [
        StructField("rkey", StringType()),
        StructField("rid", LongType()),
        StructField("rv", LongType()),
        StructField("rt", LongType()),
    ]
)

WATERMARK_DELAY_S = 10
# Event times start here (seconds after the epoch), well clear of the initial watermark of 0.
T0 = 100


# ---------------------------------------------------------------------------------------------
# Input data (deterministic)


def event_files(seed: int, n_files: int, rows_per_file: int, n_keys: int = 8) -> list[Rows]:
    """Files of events; file i has event times in T0 + [8i, 8i+11], so windows span files but no
    row is ever behind the watermark (max time - 10s) of the batch before it."""
    rng = random.Random(seed)
    files = []
    next_id = 0
    for i in range(n_files):
        rows = []
        for _ in range(rows_per_file):
            rows.append(
                {
                    "key": f"k{rng.randrange(n_keys)}",
                    "id": next_id,
                    "v": rng.randrange(1, 100),
                    "t": T0 + 8 * i + rng.randrange(12),
                }
            )
            next_id += 1
        files.append(rows)
    return files


def split(files: list[Rows], phase1: int) -> list[Mapping[str, Sequence[Rows]]]:
    return [{"events": files[:phase1]}, {"events": files[phase1:]}]


# ---------------------------------------------------------------------------------------------
# Plain-Python expectations


def running_aggregates(files: Sequence[Rows], key: str = "key") -> list[dict[str, dict]]:
    """After file i: key -> {cnt, total, vmax} over files 0..i."""
    state: dict[str, dict[str, int]] = {}
    history = []
    for rows in files:
        for row in rows:
            agg = state.setdefault(row[key], {"cnt": 0, "total": 0, "vmax": 0})
            agg["cnt"] += 1
            agg["total"] += row["v"]
            agg["vmax"] = max(agg["vmax"], row["v"])
        history.append({k: dict(v) for k, v in state.items()})
    return history


def expected_update_batches(files: Sequence[Rows]) -> Batches:
    history = running_aggregates(files)
    return {
        i: sort_rows({"key": k, **history[i][k]} for k in sorted({row["key"] for row in rows}))
        for i, rows in enumerate(files)
    }


def expected_complete_batches(files: Sequence[Rows]) -> Batches:
    history = running_aggregates(files)
    return {i: sort_rows({"key": k, **agg} for k, agg in h.items()) for i, h in enumerate(history)}


def final_watermark(times: Sequence[int]) -> int:
    return max(times) - WATERMARK_DELAY_S


def python_sessions(rows: Rows, gap: int) -> list[dict[str, Any]]:
    by_key: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_key[row["key"]].append(row)
    sessions = []
    for key, events in by_key.items():
        events.sort(key=lambda r: r["t"])
        current: dict[str, Any] | None = None
        for event in events:
            if current is not None and event["t"] < current["send"]:
                current["send"] = max(current["send"], event["t"] + gap)
                current["cnt"] += 1
                current["total"] += event["v"]
            else:
                if current is not None:
                    sessions.append(current)
                current = {
                    "key": key,
                    "sstart": event["t"],
                    "send": event["t"] + gap,
                    "cnt": 1,
                    "total": event["v"],
                }
        if current is not None:
            sessions.append(current)
    return sessions


def flat(batches: Batches) -> Rows:
    return [row for b in sorted(batches) for row in batches[b]]


# ---------------------------------------------------------------------------------------------
# Scenarios


@dataclass
class Scenario:
    name: str
    sources: Mapping[str, StructType]
    phases: Sequence[Mapping[str, Sequence[Rows]]]
    build: Callable[[Mapping[str, DataFrame]], DataFrame]
    output_mode: str
    check: Callable[[Batches], None]

    def __str__(self) -> str:
        return self.name


def with_ts(df: DataFrame, seconds_col: str, ts_col: str) -> DataFrame:
    return df.withColumn(ts_col, F.timestamp_seconds(seconds_col))


def agg_by_key(frames: Mapping[str, DataFrame]) -> DataFrame:
    return (
        frames["events"]
        .groupBy("key")
        .agg(
            F.count(F.lit(1)).alias("cnt"),
            F.sum("v").alias("total"),
            F.max("v").alias("vmax"),
        )
    )


def agg_files() -> list[Rows]:
    files = event_files(seed=11, n_files=7, rows_per_file=20)
    files[4][0]["key"] = "k-new"  # a key first seen after the restart
    for row in files[-1]:  # the last batch touches only some keys
        row["key"] = f"k{row['id'] % 3}"
    return files


AGG_FILES = agg_files()


def check_update(batches: Batches) -> None:
    assert batches == expected_update_batches(AGG_FILES)


def check_complete(batches: Batches) -> None:
    assert batches == expected_complete_batches(AGG_FILES)


# Windowed aggregation, append mode. A late row (key "late", t=0) arrives in phase 2 and must be
# dropped; every emitted window must carry its complete count.
WINDOW_FILES = event_files(seed=12, n_files=7, rows_per_file=20)
WINDOW_LATE = [{"key": "late", "id": 10_000, "v": 1, "t": 0}]


def build_window(frames: Mapping[str, DataFrame]) -> DataFrame:
    return (
        with_ts(frames["events"], "t", "ts")
        .withWatermark("ts", f"{WATERMARK_DELAY_S} seconds")
        .groupBy(F.window("ts", "10 seconds"), "key")
        .agg(F.count(F.lit(1)).alias("cnt"), F.sum("v").alias("total"))
        .select(
            F.col("window.start").cast("long").alias("wstart"),
            F.col("window.end").cast("long").alias("wend"),
            "key",
            "cnt",
            "total",
        )
    )


def check_window(batches: Batches) -> None:
    all_rows = [row for rows in WINDOW_FILES for row in rows]
    windows: dict[tuple[int, str], dict[str, Any]] = {}
    for row in all_rows:
        start = row["t"] // 10 * 10
        w = windows.setdefault(
            (start, row["key"]),
            {"wstart": start, "wend": start + 10, "key": row["key"], "cnt": 0, "total": 0},
        )
        w["cnt"] += 1
        w["total"] += row["v"]
    emitted = flat(batches)
    for row in emitted:
        assert row == windows[(row["wstart"], row["key"])], row
    keys = [(r["wstart"], r["key"]) for r in emitted]
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    wm = final_watermark([r["t"] for r in all_rows])
    must = {k for k, w in windows.items() if w["wend"] <= wm - 1}
    assert must and must <= set(keys)
    assert not {k for k, w in windows.items() if w["wend"] > wm + 1} & set(keys)


# dropDuplicates on (key, id): ids repeat across files with a different payload (v), and within
# a file as identical rows.
def dedup_files() -> list[Rows]:
    rng = random.Random(13)
    files = []
    for i in range(6):
        rows = []
        for _ in range(15):
            rows.append({"key": f"k{rng.randrange(4)}", "id": rng.randrange(12), "v": i, "t": i})
        rows.append(dict(rows[0]))  # identical duplicate within the file
        files.append(rows)
    return files


DEDUP_FILES = dedup_files()


def build_dedup(frames: Mapping[str, DataFrame]) -> DataFrame:
    return frames["events"].dropDuplicates(["key", "id"])


def check_dedup(batches: Batches) -> None:
    seen: set[tuple[str, int]] = set()
    expected: Batches = {}
    for i, rows in enumerate(DEDUP_FILES):
        out = []
        for row in rows:
            if (row["key"], row["id"]) not in seen:
                seen.add((row["key"], row["id"]))
                out.append(row)
        expected[i] = sort_rows(out)
    assert batches == expected


# dropDuplicatesWithinWatermark on id: "dup-next" repeats one file later (dropped), "dup-far"
# repeats long after its expiry (emitted again).
def dedup_ww_files() -> list[Rows]:
    files = event_files(seed=14, n_files=7, rows_per_file=12)
    files[0].append({"key": "dup-next", "id": 5000, "v": 1, "t": T0 + 3})
    files[1].append({"key": "dup-next", "id": 5000, "v": 2, "t": T0 + 9})
    files[0].append({"key": "dup-far", "id": 6000, "v": 1, "t": T0 + 2})
    files[6].append({"key": "dup-far", "id": 6000, "v": 2, "t": T0 + 50})
    # More ids repeat across files (never within one: which of two rows with the same id in one
    # batch survives would depend on row order, not on the provider).
    for i, rows in enumerate(files[1:], start=1):
        rows[0]["id"] = i % 3
        rows[1]["id"] = 12 * (i - 1) + 5  # file i-1's 6th id
    return files


DEDUP_WW_FILES = dedup_ww_files()


def build_dedup_within_watermark(frames: Mapping[str, DataFrame]) -> DataFrame:
    return (
        with_ts(frames["events"], "t", "ts")
        .withWatermark("ts", f"{WATERMARK_DELAY_S} seconds")
        .dropDuplicatesWithinWatermark(["id"])
        .drop("ts")
    )


def check_dedup_within_watermark(batches: Batches) -> None:
    emitted = flat(batches)
    inputs = [row for rows in DEDUP_WW_FILES for row in rows]
    assert all(row in inputs for row in emitted)
    by_id = defaultdict(list)
    for row in emitted:
        by_id[row["id"]].append(row)
    assert by_id[5000] == [{"key": "dup-next", "id": 5000, "v": 1, "t": T0 + 3}]
    assert by_id[6000] == [
        {"key": "dup-far", "id": 6000, "v": 1, "t": T0 + 2},
        {"key": "dup-far", "id": 6000, "v": 2, "t": T0 + 50},
    ]
    for i in range(1, len(DEDUP_WW_FILES)):  # repeated in the next file: only the first
        first = next(r for r in DEDUP_WW_FILES[i - 1] if r["id"] == 12 * (i - 1) + 5)
        assert by_id[first["id"]] == [first]
    for rows in by_id.values():  # never twice within the watermark delay
        times = sorted(r["t"] for r in rows)
        assert all(b - a > WATERMARK_DELAY_S for a, b in zip(times, times[1:], strict=False))


# Session windows (gap 5s), append mode.
SESSION_GAP_S = 5
SESSION_FILES = event_files(seed=15, n_files=7, rows_per_file=10, n_keys=4)


def build_sessions(frames: Mapping[str, DataFrame]) -> DataFrame:
    return (
        with_ts(frames["events"], "t", "ts")
        .withWatermark("ts", f"{WATERMARK_DELAY_S} seconds")
        .groupBy(F.session_window("ts", f"{SESSION_GAP_S} seconds"), "key")
        .agg(F.count(F.lit(1)).alias("cnt"), F.sum("v").alias("total"))
        .select(
            "key",
            F.col("session_window.start").cast("long").alias("sstart"),
            F.col("session_window.end").cast("long").alias("send"),
            "cnt",
            "total",
        )
    )


def check_sessions(batches: Batches) -> None:
    all_rows = [row for rows in SESSION_FILES for row in rows]
    sessions = {(s["key"], s["sstart"]): s for s in python_sessions(all_rows, SESSION_GAP_S)}
    emitted = flat(batches)
    for row in emitted:
        assert row == sessions.get((row["key"], row["sstart"])), row
    keys = [(r["key"], r["sstart"]) for r in emitted]
    assert len(keys) == len(set(keys)), "a session was emitted twice"
    wm = final_watermark([r["t"] for r in all_rows])
    must = {k for k, s in sessions.items() if s["send"] <= wm - 1}
    assert len(must) >= 3 and must <= set(keys)


# Stream-stream joins: key equality and |rt - lt| <= 5s, watermarks of 10s on both sides. Keys
# "lonly"/"ronly" exist on one side only, so outer joins must emit null-padded rows.
JOIN_RANGE_S = 5


def join_files(seed: int) -> tuple[list[Rows], list[Rows]]:
    """Six files a side of eight rows each, ids numbered through the side, from one generator
    (per file, the left rows' draws then the right's)."""
    rng = random.Random(seed)
    files: dict[str, list[Rows]] = {"l": [], "r": []}
    for i in range(6):
        for side, side_files in files.items():
            side_files.append(
                [
                    {
                        f"{side}key": rng.choice(["k0", "k1", "k2", "k3", f"{side}only"]),
                        f"{side}id": 8 * i + n,
                        f"{side}v": rng.randrange(100),
                        f"{side}t": T0 + 8 * i + rng.randrange(12),
                    }
                    for n in range(8)
                ]
            )
    return files["l"], files["r"]


JOIN_LEFT, JOIN_RIGHT = join_files(16)
JOIN_COLUMNS = ["lkey", "lid", "lv", "lt", "rkey", "rid", "rv", "rt"]


def make_join_build(how: str) -> Callable[[Mapping[str, DataFrame]], DataFrame]:
    def build(frames: Mapping[str, DataFrame]) -> DataFrame:
        left = with_ts(frames["left"], "lt", "lts").withWatermark("lts", "10 seconds")
        right = with_ts(frames["right"], "rt", "rts").withWatermark("rts", "10 seconds")
        condition = F.expr(
            f"lkey = rkey AND rts >= lts - interval {JOIN_RANGE_S} seconds "
            f"AND rts <= lts + interval {JOIN_RANGE_S} seconds"
        )
        return left.join(right, condition, how).select(*JOIN_COLUMNS)

    return build


def make_join_check(how: str) -> Callable[[Batches], None]:
    left_rows = [r for rows in JOIN_LEFT for r in rows]
    right_rows = [r for rows in JOIN_RIGHT for r in rows]
    pairs = [
        {**lr, **rr}
        for lr in left_rows
        for rr in right_rows
        if lr["lkey"] == rr["rkey"] and abs(lr["lt"] - rr["rt"]) <= JOIN_RANGE_S
    ]
    matched_l = {p["lid"] for p in pairs}
    matched_r = {p["rid"] for p in pairs}
    wm = min(max(r["lt"] for r in left_rows), max(r["rt"] for r in right_rows)) - 10
    null_r = dict.fromkeys(["rkey", "rid", "rv", "rt"])
    null_l = dict.fromkeys(["lkey", "lid", "lv", "lt"])

    def check(batches: Batches) -> None:
        emitted = flat(batches)
        inner = [r for r in emitted if r["lid"] is not None and r["rid"] is not None]
        assert sort_rows(inner) == sort_rows(pairs)
        assert len(pairs) >= 10
        left_only = [r for r in emitted if r["rid"] is None]
        right_only = [r for r in emitted if r["lid"] is None]
        if how in ("left_outer", "full_outer"):
            expected = [{**lr, **null_r} for lr in left_rows if lr["lid"] not in matched_l]
            assert_unmatched("l", left_only, expected)
        else:
            assert not left_only
        if how == "full_outer":
            expected = [{**null_l, **rr} for rr in right_rows if rr["rid"] not in matched_r]
            assert_unmatched("r", right_only, expected)
        else:
            assert not right_only

    def assert_unmatched(side: str, emitted: list[dict[str, Any]], expected: Rows) -> None:
        """One side's rows without a match (``side`` is the columns' prefix): each emitted once,
        null-padded, and at least three of those the watermark passed long ago among them."""
        assert all(r in expected for r in emitted)
        assert len({r[f"{side}id"] for r in emitted}) == len(emitted)
        must = [r for r in expected if r[f"{side}t"] < wm - JOIN_RANGE_S - 2]
        assert len(must) >= 3 and all(r in emitted for r in must)

    return check


def join_scenario(how: str) -> Scenario:
    return Scenario(
        name=f"join_{how}",
        sources={"left": LEFT_SCHEMA, "right": RIGHT_SCHEMA},
        phases=[
            {"left": JOIN_LEFT[:3], "right": JOIN_RIGHT[:3]},
            {"left": JOIN_LEFT[3:], "right": JOIN_RIGHT[3:]},
        ],
        build=make_join_build(how),
        output_mode="append",
        check=make_join_check(how),
    )


# applyInPandasWithState: a running count and sum per key (update mode).
def build_pandas_state(frames: Mapping[str, DataFrame]) -> DataFrame:
    # Defined inside so that cloudpickle ships it by value to the Python workers.
    def running_count(
        key: tuple, pdfs: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        cnt, total, vmax = state.get if state.exists else (0, 0, 0)
        for pdf in pdfs:
            cnt += len(pdf)
            total += int(pdf["v"].sum())
            vmax = max(vmax, int(pdf["v"].max()))
        state.update((cnt, total, vmax))
        yield pd.DataFrame({"key": [key[0]], "cnt": [cnt], "total": [total], "vmax": [vmax]})

    return (
        frames["events"]
        .groupBy("key")
        .applyInPandasWithState(
            running_count,
            outputStructType="key string, cnt long, total long, vmax long",
            stateStructType="cnt long, total long, vmax long",
            outputMode="update",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    )


SCENARIOS = [
    Scenario(
        "agg_update",
        {"events": EVENT_SCHEMA},
        split(AGG_FILES, 3),
        agg_by_key,
        "update",
        check_update,
    ),
    Scenario(
        "agg_complete",
        {"events": EVENT_SCHEMA},
        split(AGG_FILES, 4),
        agg_by_key,
        "complete",
        check_complete,
    ),
    Scenario(
        "window_append_watermark",
        {"events": EVENT_SCHEMA},
        [
            {"events": WINDOW_FILES[:3]},
            {"events": [*WINDOW_FILES[3:5], WINDOW_LATE, *WINDOW_FILES[5:]]},
        ],
        build_window,
        "append",
        check_window,
    ),
    Scenario(
        "drop_duplicates",
        {"events": EVENT_SCHEMA},
        split(DEDUP_FILES, 3),
        build_dedup,
        "append",
        check_dedup,
    ),
    Scenario(
        "drop_duplicates_within_watermark",
        {"events": EVENT_SCHEMA},
        split(DEDUP_WW_FILES, 3),
        build_dedup_within_watermark,
        "append",
        check_dedup_within_watermark,
    ),
    Scenario(
        "session_window",
        {"events": EVENT_SCHEMA},
        split(SESSION_FILES, 3),
        build_sessions,
        "append",
        check_sessions,
    ),
    join_scenario("inner"),
    join_scenario("left_outer"),
    join_scenario("full_outer"),
    Scenario(
        "apply_in_pandas_with_state",
        {"events": EVENT_SCHEMA},
        split(AGG_FILES, 3),
        build_pandas_state,
        "update",
        check_update,
    ),
]


# ---------------------------------------------------------------------------------------------
# Runs (cached per module: the state source and metrics tests reuse them)


@pytest.fixture(scope="module")
def runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``runs(scenario_name, provider)``: the scenario's run on that provider. Both providers'
    runs of a scenario happen together, on first use."""
    cache: dict[tuple[str, str], RunResult] = {}
    by_name = {s.name: s for s in SCENARIOS}

    def get(name: str, provider: str) -> RunResult:
        if (name, provider) not in cache:
            scenario = by_name[name]
            results = run_phases(
                spark,
                list(dict.fromkeys([REFERENCE_PROVIDER, PROVIDER_UNDER_TEST])),
                Path(tmp_path_factory.mktemp(name)),
                scenario.sources,
                scenario.phases,
                scenario.build,
                scenario.output_mode,
            )
            for result in results.values():
                cache[(name, result.provider)] = result
        return cache[(name, provider)]

    yield get


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_same_output_as_reference(
    scenario: Scenario, runs: Callable[[str, str], RunResult]
) -> None:
    reference = runs(scenario.name, REFERENCE_PROVIDER)
    # The harness and the expectations hold on Spark's provider first.
    scenario.check(reference.batches)
    under_test = runs(scenario.name, PROVIDER_UNDER_TEST)
    diff = diff_batches(reference.batches, under_test.batches)
    assert not diff, f"{scenario.name}: per-batch outputs differ from {REFERENCE_PROVIDER}:\n{diff}"
    assert under_test.batches == reference.batches
    assert any(under_test.batches.values()), "no output at all"
    # The query really restarted: phase 2 continued the batch ids of phase 1.
    phase1, phase2 = under_test.progresses
    assert phase1 and phase2 and phase2[0]["batchId"] == phase1[-1]["batchId"] + 1
    scenario.check(under_test.batches)


def state_rows(spark: SparkSession, checkpoint: Path, **options: Any) -> Rows:
    reader = spark.read.format("statestore")
    for name, value in options.items():
        reader = reader.option(name, value)
    df = reader.load(str(checkpoint))
    return rows_of(df.select("key", "value", "partition_id"))


def test_state_reader_reads_provider_state(
    spark: SparkSession, runs: Callable[[str, str], RunResult]
) -> None:
    reference = runs("agg_update", REFERENCE_PROVIDER)
    under_test = runs("agg_update", PROVIDER_UNDER_TEST)

    latest = state_rows(spark, under_test.checkpoint)
    assert latest == state_rows(spark, reference.checkpoint)
    final = running_aggregates(AGG_FILES)[-1]
    assert len(latest) == len(final)
    by_key = {row["key"]["key"]: row["value"] for row in latest}
    for key, agg in final.items():  # value columns hold the partial aggregates
        assert by_key[key] == {"count": agg["cnt"], "sum": agg["total"], "max": agg["vmax"]}

    # An older version of the state (end of phase 1), read from the checkpoint.
    old = state_rows(spark, under_test.checkpoint, batchId=2)
    assert old == state_rows(spark, reference.checkpoint, batchId=2)
    after_phase1 = running_aggregates(AGG_FILES[:3])[-1]
    assert {row["key"]["key"]: row["value"]["count"] for row in old} == {
        k: v["cnt"] for k, v in after_phase1.items()
    }


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_state_contents_match_reference(
    scenario: Scenario, spark: SparkSession, runs: Callable[[str, str], RunResult]
) -> None:
    """The statestore source reads the same state from both checkpoints: at the end, and as of
    the last batch of phase 1 (an older version, from before the restart)."""
    reference = runs(scenario.name, REFERENCE_PROVIDER)
    under_test = runs(scenario.name, PROVIDER_UNDER_TEST)
    end_of_phase1 = reference.progresses[0][-1]["batchId"]
    assert under_test.progresses[0][-1]["batchId"] == end_of_phase1
    sides = [{"joinSide": "left"}, {"joinSide": "right"}] if "join" in scenario.name else [{}]
    total_rows = 0
    for options in sides:
        for version in ({}, {"batchId": end_of_phase1}):
            expected = state_rows(spark, reference.checkpoint, **options, **version)
            actual = state_rows(spark, under_test.checkpoint, **options, **version)
            assert actual == expected, (options, version)
            total_rows += len(expected)
    assert total_rows > 0

    # The state-metadata source and the state row counts in the progress agree too.
    ours = rows_of(spark.read.format("state-metadata").load(str(under_test.checkpoint)))
    theirs = rows_of(spark.read.format("state-metadata").load(str(reference.checkpoint)))
    assert ours == theirs and ours
    ours_total = [
        op["numRowsTotal"] for op in under_test.last_progress_with_state()["stateOperators"]
    ]
    theirs_total = [
        op["numRowsTotal"] for op in reference.last_progress_with_state()["stateOperators"]
    ]
    assert ours_total == theirs_total


def test_state_metadata_source(spark: SparkSession, runs: Callable[[str, str], RunResult]) -> None:
    reference = runs("agg_update", REFERENCE_PROVIDER)
    under_test = runs("agg_update", PROVIDER_UNDER_TEST)
    ours = rows_of(spark.read.format("state-metadata").load(str(under_test.checkpoint)))
    theirs = rows_of(spark.read.format("state-metadata").load(str(reference.checkpoint)))
    assert ours == theirs
    assert len(ours) == 1
    assert ours[0]["operatorName"] == "stateStoreSave"
    assert ours[0]["numPartitions"] == 2
    assert ours[0]["maxBatchId"] == len(AGG_FILES) - 1


@pytest.mark.parametrize("provider", [REFERENCE_PROVIDER, PROVIDER_UNDER_TEST])
def test_num_rows_total_is_number_of_keys(
    provider: str, runs: Callable[[str, str], RunResult]
) -> None:
    result = runs("agg_update", provider)
    progress = result.last_progress_with_state()
    operator = progress["stateOperators"][0]
    n_keys = len({row["key"] for rows in AGG_FILES for row in rows})
    # The last batch touches 3 keys; the total counts every key in the state.
    assert n_keys == 9
    assert operator["numRowsTotal"] == n_keys, operator
