"""A stateful count run as its own process, for the kill/restart test.

usage: python3 agg_driver.py INPUT_DIR CHECKPOINT OUTPUT_DIR [PROVIDER_CLASS [ENGINE]]

Counts and sums ``v`` per ``key`` over the JSON files in INPUT_DIR, one file per micro-batch, with
an availableNow trigger: it processes everything there and exits 0. ENGINE is ``aggregation``
(Spark's streaming aggregation, update mode; the default) or ``python-api`` (a keyedstate
``KeyedProcessFunction`` with a ValueState per key, emitting per element; the sink keeps each
key's last row of the batch, which is what the aggregation emits). Each batch's output is written
idempotently to OUTPUT_DIR/batch-<id>.json (temp file + os.replace), so a batch replayed after a
crash simply rewrites the same file.
"""

from __future__ import annotations

import script_paths  # noqa: F401 - first: puts the repository and the package on sys.path

# isort: split

import json
import os
import sys
from pathlib import Path

import keyedstate
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.keyed_functions import CountSum, last_per_key
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    await_finished,
    rows_of,
    session_builder,
)

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("v", LongType()),
    ]
)


def write_batch(output_dir: Path, batch_id: int, rows: list) -> None:
    final = output_dir / f"batch-{batch_id}.json"
    tmp = output_dir / f".batch-{batch_id}.json.tmp"
    with tmp.open("w") as out:
        json.dump(rows, out, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, final)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5, 6):
        print(__doc__, file=sys.stderr)
        return 2
    input_dir, output_dir = Path(argv[1]), Path(argv[3])
    checkpoint = argv[2]  # a path or a URI (hdfs://, s3a://: Path would mangle the "//")
    provider = argv[4] if len(argv) >= 5 else PROVIDER_UNDER_TEST
    engine = argv[5] if len(argv) == 6 else "aggregation"
    output_dir.mkdir(parents=True, exist_ok=True)

    # Keep few versions, so maintenance deletes old state files while the driver gets killed.
    builder = session_builder("keyedstate-agg-driver", provider)
    spark = builder.config("spark.sql.streaming.minBatchesToRetain", "4").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)

    def sink(df: DataFrame, batch_id: int) -> None:
        rows = rows_of(df)
        write_batch(output_dir, batch_id, last_per_key(rows) if engine == "python-api" else rows)
        print(f"DRIVER batch {batch_id} written", flush=True)

    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(input_dir))
    if engine == "python-api":
        counts = keyedstate.key_by(events, "key").process(
            CountSum(), "key string, cnt long, total long"
        )
    else:
        counts = events.groupBy("key").agg(
            F.count(F.lit(1)).alias("cnt"), F.sum("v").alias("total")
        )
    query = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .start()
    )
    await_finished(query, timeout_s=600)
    spark.stop()
    print("DRIVER done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
