"""State TTL (docs/ttl.md) on real streaming queries: aggregation, dropDuplicates and
applyInPandasWithState.

Event-time TTL is judged against each batch's watermark as the offset log records it, so the
expiry decisions below are exact: every input file is one micro-batch, and the watermark of batch
``i`` is the largest event time of the batches before it. Each scenario computes its expected
output here in plain Python. Processing-time TTL is tested across restarts with pauses far longer
than the TTL, so the outcome does not depend on machine speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import keyedstate
import pandas as pd
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from tests.support.streaming_harness import (
    BatchCollector,
    FileInput,
    await_finished,
    start_query,
)
from tests.support.ttl_queries import (
    EVENT_TTL,
    PREFIX,
    SCHEMA,
    Query,
    Rows,
    count_by_key,
    events,
    expired_key_starts_fresh,
    session_conf,
    with_watermark,
)

# ---------------------------------------------------------------------------------------------
# Aggregation: a running count per key, without any event time in the key, so Spark itself never
# evicts the state; TTL does. A write restarts the time to live.


def test_aggregation_expired_key_starts_fresh_writes_refresh(
    spark: SparkSession, tmp_path: Path
) -> None:
    expired_key_starts_fresh(Query(spark, tmp_path, count_by_key))


def test_aggregation_restart_with_changed_processing_time_ttl(
    spark: SparkSession, tmp_path: Path
) -> None:
    # No watermark at all: without TTL this state would grow forever.
    q = Query(spark, tmp_path, lambda df: df.groupBy("key").agg(F.count("*").alias("cnt")))
    q.run([events(("a", 0), ("b", 0))], {})
    # TTL switched on: state written before keeps its timestamps (seconds old: alive under 1h).
    q.run([events(("a", 1), ("b", 1))], {"ttl.duration": "1 hour"})
    time.sleep(9)
    # Shortened to 8 s: both were last written more than 9 s ago, so both start over; the second
    # batch of the run follows within seconds and sees a's new entry.
    q.run([events(("a", 2), ("b", 2)), events(("a", 3))], {"ttl.duration": "8s"})
    assert q.outputs() == [
        [{"key": "a", "cnt": 1}, {"key": "b", "cnt": 1}],
        [{"key": "a", "cnt": 2}, {"key": "b", "cnt": 2}],
        [{"key": "a", "cnt": 1}, {"key": "b", "cnt": 1}],
        [{"key": "a", "cnt": 2}],
    ]


# ---------------------------------------------------------------------------------------------
# dropDuplicates on key only (the event time is not in the key: Spark never evicts this state).


def dedup(df: DataFrame) -> DataFrame:
    return with_watermark(df).dropDuplicates(["key"]).drop("ts")


@pytest.mark.parametrize(
    ("update_type", "last_output"),
    [
        # A duplicate is a read: OnReadAndWrite restarts "1"'s time to live at watermark 8.
        ("OnReadAndWrite", events(("2", 17))),
        ("OnCreateAndWrite", events(("1", 17), ("2", 17))),
    ],
)
def test_dedup_expired_key_is_new_again_reads_refresh_as_configured(
    spark: SparkSession, tmp_path: Path, update_type: str, last_output: Rows
) -> None:
    q = Query(spark, tmp_path, dedup, output_mode="append")
    settings = {**EVENT_TTL, "ttl.updateType": update_type}
    q.run([events(("1", 0), ("2", 0)), events(("x", 8)), events(("1", 9))], settings)
    q.run([events(("y", 16)), events(("1", 17), ("2", 17))], settings)
    assert q.outputs() == [
        events(("1", 0), ("2", 0)),
        events(("x", 8)),
        events(("y", 16)),
        last_output,
    ]
    # Spark's state reader, through the provider with the same TTL, at the last batch's time
    # (watermark 16): x, written at watermark 0 and never cleaned up, is stored but expired.
    with session_conf(spark, settings):
        state = spark.read.format("statestore").load(str(q.checkpoint)).collect()
    assert sorted(row["key"]["key"] for row in state) == ["1", "2", "y"]


def test_dedup_return_expired_if_not_cleaned_up_until_a_strategy_removes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    q = Query(spark, tmp_path, dedup, output_mode="append")
    stale = {
        **EVENT_TTL,
        "ttl.visibility": "ReturnExpiredIfNotCleanedUp",
        "ttl.cleanup.fullSnapshot": "false",
    }
    q.run([events(("1", 0), ("2", 0)), events(("x", 8)), events(("y", 16))], stale)
    # Watermark 16: "1" (written at watermark 0) has expired but nothing removed it, so it is
    # still returned and the row is a duplicate.
    q.run([events(("1", 17))], stale)
    # Incremental cleanup switched on: the commit at watermark 17 removes 1, 2 and x, after which
    # 1 and 2 are new keys again; the one at watermark 18 removes y (written at watermark 8).
    cleaning = {**stale, "ttl.cleanup.incremental.size": "100"}
    q.run([events(("z", 18)), events(("1", 19), ("2", 19))], cleaning)
    assert q.outputs() == [
        events(("1", 0), ("2", 0)),
        events(("x", 8)),
        events(("y", 16)),
        events(("z", 18)),
        events(("1", 19), ("2", 19)),
    ]
    assert q.metric_total("ttlRemovedIncremental") == 4
    assert q.metric_total("ttlExpiredHidden") == 0


@pytest.mark.parametrize(
    ("strategy", "settings"),
    [
        # Every commit is a snapshot without changelog checkpointing: full-snapshot and
        # compaction cleanup then run on every commit, which makes the counts below exact.
        ("ttlRemovedFullSnapshot", {"changelogCheckpointing": "false"}),
        (
            "ttlRemovedCompaction",
            {"changelogCheckpointing": "false", "ttl.cleanup.compaction": "true"},
        ),
        (
            "ttlRemovedIncremental",
            {"ttl.cleanup.fullSnapshot": "false", "ttl.cleanup.incremental.size": "1000"},
        ),
    ],
)
def test_dedup_churn_each_strategy_removes_expired_state(
    spark: SparkSession, tmp_path: Path, strategy: str, settings: Mapping[str, str]
) -> None:
    # New keys every batch, old ones never seen again: batch i holds 5 keys at event time 10 i.
    batches = [events(*((f"{i}-{n}", 10 * i) for n in range(5))) for i in range(8)]
    ttl_s = 15
    conf = {"ttl.duration": f"{ttl_s}s", "ttl.timeCharacteristic": "EventTime", **settings}
    q = Query(spark, tmp_path, dedup, output_mode="append")
    q.run(batches[:4], conf)
    q.run(batches[4:], conf)
    # Watermark of batch i, and what the last batch's commit leaves stored (the last batch may be
    # a no-data batch that Spark runs because the watermark moved).
    wm = [0] + [10 * (i - 1) for i in range(1, len(batches))]
    final_wm = q.last_watermark_s()
    assert final_wm >= wm[-1]
    live = sum(len(b) for i, b in enumerate(batches) if wm[i] + ttl_s > final_wm)
    total = sum(len(b) for b in batches)
    assert [len(rows) for rows in q.outputs()] == [5] * len(batches)
    assert q.state_rows() == live
    assert q.metric_total(strategy) == total - live
    other = {"ttlRemovedFullSnapshot", "ttlRemovedCompaction", "ttlRemovedIncremental"} - {strategy}
    assert all(q.metric_total(name) == 0 for name in other)


# ---------------------------------------------------------------------------------------------
# applyInPandasWithState: a running count per key; an expired key's state does not exist.


def pandas_count(df: DataFrame) -> DataFrame:
    def running_count(
        key: tuple, pdfs: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        (cnt,) = state.get if state.exists else (0,)
        for pdf in pdfs:
            cnt += len(pdf)
        state.update((cnt,))
        yield pd.DataFrame({"key": [key[0]], "cnt": [cnt]})

    return (
        with_watermark(df)
        .groupBy("key")
        .applyInPandasWithState(
            running_count,
            outputStructType="key string, cnt long",
            stateStructType="cnt long",
            outputMode="update",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    )


def test_apply_in_pandas_with_state_ttl_per_operator_and_cleanup(
    spark: SparkSession, tmp_path: Path
) -> None:
    q = Query(spark, tmp_path, pandas_count)
    settings = {
        "ttl.operator.0.duration": "10s",
        "ttl.operator.0.timeCharacteristic": "EventTime",
        "ttl.cleanup.incremental.size": "100",
    }
    q.run([events(("a", 0), ("b", 0), ("z", 0)), events(("k", 8)), events(("b", 9))], settings)
    q.run([events(("k", 16)), events(("a", 17), ("b", 17))], settings)
    assert q.outputs() == [
        [{"key": "a", "cnt": 1}, {"key": "b", "cnt": 1}, {"key": "z", "cnt": 1}],
        [{"key": "k", "cnt": 1}],
        [{"key": "b", "cnt": 2}],
        [{"key": "k", "cnt": 2}],
        [{"key": "a", "cnt": 1}, {"key": "b", "cnt": 3}],
    ]
    # At the last commit (watermark 16): a and b were just written, k (written at watermark 9)
    # lives until 19; z, never seen again, was removed by the incremental cleanup. The expired a
    # of the first batch was overwritten (a fresh entry), not removed.
    assert q.last_watermark_s() < 19  # no later batch expired k
    assert q.state_rows() == 3
    assert q.metric_total("ttlRemovedIncremental") == 1
    # With TTL off for this operator, the same input keeps counting.
    q2 = Query(spark, tmp_path / "off", pandas_count)
    off = {**settings, "ttl.operator.0.duration": "none", "ttl.duration": "10s"}
    q2.run([events(("a", 0)), events(("k", 8)), events(("k", 16)), events(("a", 17))], off)
    assert q2.outputs()[-1] == [{"key": "a", "cnt": 2}]


# ---------------------------------------------------------------------------------------------
# Session windows and dropDuplicatesWithinWatermark evict by watermark themselves; a TTL longer
# than their state's life must change nothing (stamps, hidden-entry checks and cleanup scans
# run on their prefix-scanned and watermark-evicted state all the same).


def sessions(df: DataFrame) -> DataFrame:
    return (
        with_watermark(df)
        .groupBy("key", F.session_window("ts", "5 seconds"))
        .agg(F.count("*").alias("cnt"))
        .select("key", F.col("session_window.start").cast("long").alias("start"), "cnt")
    )


def dedup_within_watermark(df: DataFrame) -> DataFrame:
    return (
        df.withColumn("ts", F.timestamp_seconds("t")).withWatermark("ts", "5 seconds")
        .dropDuplicatesWithinWatermark(["key"]).drop("ts")
    )


@pytest.mark.parametrize("build", [sessions, dedup_within_watermark])
def test_long_ttl_changes_nothing_for_operators_that_evict_by_watermark(
    spark: SparkSession, tmp_path: Path, build: Callable[[DataFrame], DataFrame]
) -> None:
    files = [
        events(("a", 0), ("b", 1)),
        events(("a", 3), ("b", 9)),
        events(("a", 20), ("c", 21)),
        events(("b", 22), ("a", 40)),
        events(("z", 60)),
    ]
    settings = {
        "ttl.duration": "1d",
        "ttl.timeCharacteristic": "EventTime",
        "ttl.cleanup.incremental.size": "100",
        "changelogCheckpointing": "false",  # full-snapshot cleanup scans on every commit
    }
    with_ttl = Query(spark, tmp_path / "ttl", build, output_mode="append")
    with_ttl.run(files[:3], settings)
    with_ttl.run(files[3:], settings)
    without = Query(spark, tmp_path / "plain", build, output_mode="append")
    without.run(files[:3], {})
    without.run(files[3:], {})
    assert with_ttl.outputs() == without.outputs()
    assert sum(len(rows) for rows in with_ttl.outputs()) >= 4
    assert with_ttl.metric_total("ttlExpiredHidden") == 0
    assert with_ttl.metric_total("ttlRemovedFullSnapshot") == 0


def test_ttl_on_a_stream_stream_join_fails_naming_the_operator(
    spark: SparkSession, tmp_path: Path
) -> None:
    left, right = FileInput(tmp_path / "left", SCHEMA), FileInput(tmp_path / "right", SCHEMA)
    left.add(events(("a", 0)))
    right.add(events(("a", 0)))
    joined = left.read_stream(spark).join(
        right.read_stream(spark).withColumnRenamed("t", "t2"), "key"
    )
    with session_conf(spark, {"ttl.duration": "1h"}):
        query = start_query(
            spark, keyedstate.PROVIDER_CLASS, joined, "append", tmp_path / "ck", BatchCollector()
        )
        with pytest.raises(StreamingQueryException) as failure:
            await_finished(query)
    message = str(failure.value)
    assert "keyedstate TTL cannot be used for operator 0" in message
    assert "stream-stream join" in message
    assert PREFIX + "ttl.operator.0.duration=none" in message
