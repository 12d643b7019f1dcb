"""Kafka in, keyed state, PostgreSQL and Kafka out: the end-to-end exactly-once pipeline, run as
its own process for tests/sinks/test_exactly_once_pipeline.py (which SIGKILLs it).

usage: python3 pipeline_driver.py CONFIG_JSON

CONFIG_JSON names the broker (``bootstrap``), the input and output topics, the PostgreSQL
connection (``postgres``: libpq keywords) and table, the checkpoint, a directory for progress
markers and ``max_offsets`` per micro-batch. The query reads the input topic (availableNow, so
it ends once everything there is processed), keeps a running count and sum per key in a
keyedstate ``ValueState``, and writes one row per event ``(key, offset, cnt, total)`` to both
sinks of keyedstate.sinks. It runs under ``keyedstate.run`` with a fixed-delay restart strategy:
a database or broker outage fails the query, which restarts from its checkpoint.

Markers (empty files) tell the test where a batch is: ``sink-<batch>`` when the sinks start,
``postgres-<batch>`` once the PostgreSQL transaction committed, ``kafka-<batch>`` once the Kafka
transactions did; the test kills at such points.
"""

from __future__ import annotations

import script_paths  # noqa: F401 - first: puts the repository and the package on sys.path

# isort: split

import json
import logging
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import keyedstate
from keyedstate import sinks
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from tests.support.keyed_functions import CountSum
from tests.support.streaming_harness import session_builder

OUTPUT_DDL = "key string, offset long, cnt long, total long"


class RunningTotal(CountSum):
    """CountSum with each event's offset in its output row."""

    def output(self, value: Any, cnt: int, total: int) -> tuple[Any, ...]:  # noqa: ANN401
        return value.key, value.offset, cnt, total


def mark(markers: Path, name: str) -> None:
    (markers / name).touch()


def build_query(spark: SparkSession, config: dict[str, Any]) -> StreamingQuery:
    markers = Path(config["markers"])
    to_postgres = sinks.postgres(config["table"], mode="append", **config["postgres"])
    to_kafka = sinks.kafka(config["output_topic"], config["bootstrap"])

    def write(df: DataFrame, batch_id: int) -> None:
        # Two sinks read the batch: compute it (and commit its state) once.
        df = df.persist()
        try:
            mark(markers, f"sink-{batch_id}")
            to_postgres(df, batch_id)
            mark(markers, f"postgres-{batch_id}")
            to_kafka(df.select("key", F.to_json(F.struct(*df.columns)).alias("value")), batch_id)
            mark(markers, f"kafka-{batch_id}")
        finally:
            df.unpersist()

    events = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config["bootstrap"])
        .option("subscribe", config["input_topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(config["max_offsets"]))
        .load()
        .select(
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").cast("long").alias("v"),
            "offset",
        )
    )
    # A key's records are in one topic partition (keyed producer): offset order is their order.
    totals = keyedstate.key_by(events, "key", order_by="offset").process(
        RunningTotal(), OUTPUT_DDL
    )
    return (
        totals.writeStream.option("checkpointLocation", config["checkpoint"])
        .foreachBatch(write)
        .trigger(availableNow=True)
        .start()
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    config = json.loads(Path(argv[1]).read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    spark = session_builder("keyedstate-pipeline-driver").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    keyedstate.run(
        lambda: build_query(spark, config),
        restart_strategy=keyedstate.fixed_delay_restart(attempts=30, delay=timedelta(seconds=1)),
        spark=spark,
    )
    spark.stop()
    print("DRIVER done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
