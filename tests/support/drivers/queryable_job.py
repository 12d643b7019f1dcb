"""Driver for tests/service/test_queryable_cluster.py: queryable state on a standalone cluster
(two one-core executors on two loopback hosts), the lookups answered by the executors' state
servers over HTTP. Prints one JSON line ``SUMMARY {...}``.

usage: queryable_job.py MASTER_URL WORKDIR

Runs a keyed function with queryable states (tests/support/keyed_functions.py's
``QueryableTotals``) over 4 partitions. For each of BATCHES batches: every key's value through
the client, with the batch it reflects, and the state reader's values at that batch. Then it
SIGKILLs one of the two executors, records what lookups answer meanwhile
(values of a committed batch, or "state unavailable"; never anything else), writes more input,
and records the lookups once the query has run a batch on the new executors.
"""

from __future__ import annotations

import script_paths  # noqa: F401 - first: puts the repository and the package on sys.path

# isort: split

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import keyedstate
from keyedstate.errors import QueryServiceError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.keyed_functions import QueryableTotals
from tests.support.servers.spark_standalone import executor_pids, job_builder

SCHEMA = StructType(
    [StructField("k", StringType()), StructField("v", LongType()), StructField("tag", StringType())]
)
KEYS = [f"user{i}" for i in range(16)]
BATCHES = 3
WAIT_S = 180.0


def write_file(folder: Path, n: int) -> None:
    rows = [
        {"k": KEYS[(n * 5 + i) % len(KEYS)], "v": n * 100 + i, "tag": f"t{i % 3}"}
        for i in range(24)
    ]
    tmp = folder / f".part-{n:03d}"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / f"part-{n:03d}.json")


def await_batch(query: StreamingQuery, checkpoint: Path, batch: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while not (checkpoint / "commits" / str(batch)).exists():
        if not query.isActive or time.monotonic() > deadline:
            raise RuntimeError(f"batch {batch} not committed: {query.exception()}")
        time.sleep(0.05)


def reader_values(spark: SparkSession, checkpoint: Path, batch: int) -> dict[str, Any]:
    frame = keyedstate.state.read(spark, str(checkpoint), "totals", "total", batch_id=batch)
    return {row["k"]: row["value"] for row in frame.collect()}


def main(master: str, workdir: Path) -> dict[str, Any]:
    builder = job_builder(master, "keyedstate-queryable")
    if os.environ.get("PYTHONPATH"):  # the executors' Python workers import keyedstate too
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    spark = keyedstate.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    source, checkpoint = workdir / "input", workdir / "checkpoint"
    source.mkdir(parents=True)
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    frame = keyedstate.key_by(stream, "k").process(
        QueryableTotals(), "k string, total long", uid="totals"
    )
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    summary: dict[str, Any] = {
        "app_id": spark.sparkContext.applicationId,
        "batches": [],
        "during_loss": [],
    }
    try:
        write_file(source, 0)
        await_batch(query, checkpoint, 0)
        client = keyedstate.QueryableStateClient.for_checkpoint(str(checkpoint))
        for n in range(BATCHES):
            if n > 0:
                write_file(source, n)
                await_batch(query, checkpoint, n)
            answer = client.lookup("totals", KEYS, min_batch=n)
            summary["batches"].append({
                "batch": answer.batch,
                "values": answer.values,
                "reader": reader_values(spark, checkpoint, answer.batch),
            })  # fmt: skip

        # An executor lost: what lookups answer until the query has run a batch without it.
        pids = executor_pids()
        summary["executors_before"] = len(pids)
        os.kill(pids[0], signal.SIGKILL)
        summary["killed"] = pids[0]
        write_file(source, BATCHES)
        deadline = time.monotonic() + WAIT_S
        while not (checkpoint / "commits" / str(BATCHES)).exists() and time.monotonic() < deadline:
            try:
                answer = client.lookup("totals", KEYS, timeout=5)
                summary["during_loss"].append({"batch": answer.batch, "values": answer.values})
            except QueryServiceError as e:
                summary["during_loss"].append({"error_id": e.error_id, "message": str(e)[:300]})
            time.sleep(0.2)
        await_batch(query, checkpoint, BATCHES)
        answer = client.lookup("totals", KEYS, min_batch=BATCHES, timeout=60)
        summary["after_loss"] = {
            "batch": answer.batch,
            "values": answer.values,
            "reader": reader_values(spark, checkpoint, answer.batch),
        }
        summary["readers_by_batch"] = {
            str(b): reader_values(spark, checkpoint, b) for b in range(BATCHES + 1)
        }
    finally:
        query.stop()
        spark.stop()
    return summary


if __name__ == "__main__":
    result = main(sys.argv[1], Path(sys.argv[2]))
    print("SUMMARY " + json.dumps(result), flush=True)
