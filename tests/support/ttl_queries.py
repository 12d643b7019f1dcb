"""Queries with state TTL (docs/ttl.md), run in phases over one checkpoint, and the event-time
scenario of a running count per key: tests/provider/test_ttl_queries.py, and the storage suite on
remote checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import keyedstate
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.streaming_harness import (
    BatchCollector,
    FileInput,
    await_finished,
    start_query,
)
from tests.support.streaming_harness import session_conf as harness_session_conf

PREFIX = "spark.sql.streaming.stateStore.keyedstate."
SCHEMA = StructType([StructField("key", StringType()), StructField("t", LongType())])
Rows = list[dict[str, Any]]


def session_conf(spark: SparkSession, settings: Mapping[str, str]) -> AbstractContextManager[None]:
    """Sets keyedstate options for the duration (``ttl.duration`` is
    ``spark...keyedstate.ttl.duration``)."""
    keys = {k if k.startswith("spark.") else PREFIX + k: v for k, v in settings.items()}
    return harness_session_conf(spark, keys)


class Query:
    """One query over one checkpoint, run in phases (each run processes what was added, stops)."""

    def __init__(
        self,
        spark: SparkSession,
        workdir: Path,
        build: Callable[[DataFrame], DataFrame],
        output_mode: str = "update",
    ) -> None:
        self.spark = spark
        self.input = FileInput(workdir / "input", SCHEMA)
        self.checkpoint = workdir / "checkpoint"
        self.build = build
        self.output_mode = output_mode
        self.collector = BatchCollector()
        self.progress: list[dict[str, Any]] = []

    def run(self, files: Sequence[Rows], settings: Mapping[str, str]) -> None:
        self.input.add_all(files)
        with session_conf(self.spark, settings):
            query = start_query(
                self.spark,
                keyedstate.PROVIDER_CLASS,  # TTL is a keyedstate feature
                self.build(self.input.read_stream(self.spark)),
                self.output_mode,
                self.checkpoint,
                self.collector,
            )
            try:
                await_finished(query)
            finally:
                if query.isActive:
                    query.stop()
        self.progress += [json.loads(p.json) for p in query.recentProgress]

    def outputs(self) -> list[Rows]:
        """The non-empty batch outputs in batch order (no-data batches output nothing)."""
        return [rows for _, rows in sorted(self.collector.non_empty().items())]

    def state_rows(self) -> int:
        """Rows stored in the state after the last batch (expired ones not yet removed included)."""
        last = [p for p in self.progress if p.get("stateOperators")][-1]
        return sum(op["numRowsTotal"] for op in last["stateOperators"])

    def last_watermark_s(self) -> int:
        """The watermark of the last batch, from the offset log (the provider's TTL clock)."""
        offsets = self.checkpoint / "offsets"
        last = max((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        return json.loads(last.read_text().splitlines()[1])["batchWatermarkMs"] // 1000

    def metric_total(self, name: str) -> int:
        return sum(
            op["customMetrics"].get(name, 0)
            for p in self.progress
            for op in p.get("stateOperators", [])
        )


def events(*rows: tuple[str, int]) -> Rows:
    return [{"key": k, "t": t} for k, t in rows]


def with_watermark(df: DataFrame) -> DataFrame:
    return df.withColumn("ts", F.timestamp_seconds("t")).withWatermark("ts", "0 seconds")


EVENT_TTL = {"ttl.duration": "10s", "ttl.timeCharacteristic": "EventTime"}


def count_by_key(df: DataFrame) -> DataFrame:
    return with_watermark(df).groupBy("key").agg(F.count("*").alias("cnt"))


def expired_key_starts_fresh(q: Query) -> None:
    """The event-time TTL scenario of a running count per key (``count_by_key``), across a
    restart: an expired key starts over, a write refreshes a key's time to live."""
    # Batch i's watermark is the largest event time of batches < i: 0, 0, 8, 9, 16.
    q.run([events(("a", 0), ("b", 0)), events(("k", 8)), events(("b", 9))], EVENT_TTL)
    # Restarted from the checkpoint. At watermark 16: a (last written at watermark 0) expired
    # (0 + 10 <= 16) and starts over; b was written again at watermark 8 and lives until 18.
    q.run([events(("k", 16)), events(("a", 17), ("b", 17))], EVENT_TTL)
    assert q.outputs() == [
        [{"key": "a", "cnt": 1}, {"key": "b", "cnt": 1}],
        [{"key": "k", "cnt": 1}],
        [{"key": "b", "cnt": 2}],
        [{"key": "k", "cnt": 2}],
        [{"key": "a", "cnt": 1}, {"key": "b", "cnt": 3}],
    ]
    assert q.metric_total("ttlExpiredHidden") >= 1
