"""Driver for test_standalone_cluster: runs a stateful query on a standalone cluster, kills an
executor mid-stream, and prints a JSON summary. Usage: cluster_job.py MASTER_URL WORKDIR"""

from __future__ import annotations

import script_paths  # noqa: F401 - first: puts the repository and the package on sys.path

# isort: split

import json
import os
import signal
import sys
import time
from pathlib import Path

import keyedstate
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.servers.spark_standalone import executor_pids, job_builder

SCHEMA = StructType([StructField("k", StringType()), StructField("v", LongType())])


def write_batch(folder: Path, n: int) -> None:
    rows = [{"k": f"key-{(n * 7 + i) % 40}", "v": n * 100 + i} for i in range(60)]
    tmp = folder / f".batch-{n:03d}"
    tmp.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tmp.rename(folder / f"batch-{n:03d}.json")


def main(master: str, workdir: Path) -> dict[str, int]:
    events, checkpoint = workdir / "events", workdir / "checkpoint"
    events.mkdir(parents=True)
    spark = keyedstate.configure(job_builder(master, "keyedstate-cluster-test")).getOrCreate()
    try:
        deadline = time.time() + 90
        while len(executor_pids()) < 2 and time.time() < deadline:
            time.sleep(0.5)
        executors = len(executor_pids())

        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(events))
        totals = stream.groupBy("k").agg(F.sum("v").alias("total"), F.count("*").alias("n"))
        query = (
            totals.writeStream.format("memory").queryName("cluster_totals").outputMode("complete")
            .option("checkpointLocation", str(checkpoint)).start()
        )
        for n in range(3):
            write_batch(events, n)
            query.processAllAvailable()

        # Every executor that wrote state dies; the master starts new ones, which must load
        # each partition's versions from the checkpoint alone.
        for pid in executor_pids():
            os.kill(pid, signal.SIGKILL)
        for n in range(3, 7):
            write_batch(events, n)
            query.processAllAvailable()
        progress = query.recentProgress
        query.stop()

        downloaded = sum(
            op["customMetrics"].get("keyedstateLoadBytesDownloaded", 0)
            for p in progress if p["batchId"] >= 3 for op in p["stateOperators"]
        )
        streamed = spark.table("cluster_totals")
        expected = (
            spark.read.schema(SCHEMA).json(str(events))
            .groupBy("k").agg(F.sum("v").alias("total"), F.count("*").alias("n"))
        )
        return {
            "executors": executors,
            "bytes_downloaded_after_kill": downloaded,
            "keys": streamed.count(),
            "differences": streamed.exceptAll(expected).count()
            + expected.exceptAll(streamed).count(),
        }
    finally:
        spark.stop()


if __name__ == "__main__":
    summary = main(sys.argv[1], Path(sys.argv[2]))
    print("SUMMARY " + json.dumps(summary), flush=True)
