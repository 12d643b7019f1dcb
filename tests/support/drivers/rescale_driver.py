"""``keyedstate.rescale`` (or a running query) in a process of its own, for the rescale tests.

usage:
  python3 rescale_driver.py rescale CHECKPOINT PARTITIONS [--output DST] [--in-place]
  python3 rescale_driver.py wait GO_FILE
  python3 rescale_driver.py query INPUT_DIR CHECKPOINT PARTITIONS [--once]

``rescale`` builds a SparkSession through ``keyedstate.configure`` (the tests' session builder),
prints ``DRIVER session`` once the session is up, calls ``keyedstate.rescale`` and prints
``DRIVER result <json>`` and ``DRIVER done``; a failure prints ``DRIVER error <message>`` and
exits 3. The tests kill its process group (JVM included) at chosen points.

``wait`` does the same, but after ``DRIVER session`` it waits for GO_FILE to appear and takes
the arguments from it (JSON: checkpoint, partitions, output, in_place): the tests start it early,
so that the JVM's start-up overlaps other tests, and let it go when the checkpoint is ready.

``query`` runs a count/sum per key (update mode, keyedstate's provider) over the JSON files of
INPUT_DIR with a short processing-time trigger and never stops by itself: the tests use it as a
query that is running in another application while they try to rescale its checkpoint. With
``--once`` it processes what is there (availableNow, Spark's default maintenance interval),
stops the session, prints ``DRIVER stopped`` and stays alive until killed: an application that
ran the query and goes on (a notebook, say).
"""

from __future__ import annotations

import script_paths  # noqa: F401 - first: puts the repository and the package on sys.path

# isort: split

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

FAST_JVM = "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell"

# A short-lived JVM: the client compiler and the serial collector start it about twice as fast
# (the tests start several of these drivers).
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", FAST_JVM)

import keyedstate  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: E402

from tests.support.streaming_harness import PROVIDER_CLASS_KEY, session_builder  # noqa: E402

WAIT_LIMIT_S = 1200.0
QUERY_SCHEMA = StructType([StructField("key", StringType()), StructField("v", LongType())])


def rescale(args: argparse.Namespace) -> int:
    spark = session_builder("keyedstate-rescale-driver").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    print("DRIVER session", flush=True)
    if args.command == "wait":
        go = Path(args.go_file)
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not go.exists():
            if time.monotonic() > deadline:
                print("DRIVER never told to go", flush=True)
                return 4
            time.sleep(0.01)
        given = json.loads(go.read_text())
        args.checkpoint = given["checkpoint"]
        args.partitions = given["partitions"]
        args.output = given.get("output")
        args.in_place = given.get("in_place", False)
        print(f"DRIVER go {given}", flush=True)
    try:
        result = keyedstate.rescale(
            spark, args.checkpoint, args.partitions, args.output, in_place=args.in_place
        )
    except Exception as error:  # noqa: BLE001 - reported to the test, which judges it
        print(f"DRIVER error {error}", flush=True)
        return 3
    print(f"DRIVER result {json.dumps(dataclasses.asdict(result))}", flush=True)
    spark.stop()
    print("DRIVER done", flush=True)
    return 0


def query(args: argparse.Namespace) -> int:
    builder = session_builder("keyedstate-rescale-query-driver").config(
        "spark.sql.shuffle.partitions", str(args.partitions)
    )
    if args.once:  # Spark's default: its maintenance would not unload the stopped query's stores
        builder = builder.config("spark.sql.streaming.stateStore.maintenanceInterval", "60s")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.conf.set(PROVIDER_CLASS_KEY, keyedstate.PROVIDER_CLASS)
    counts = (
        spark.readStream.schema(QUERY_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
        .groupBy("key")
        .agg(F.count(F.lit(1)).alias("cnt"), F.sum("v").alias("total"))
    )
    writer = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", args.checkpoint)
        .format("noop")
    )
    if args.once:
        writer.trigger(availableNow=True).start().awaitTermination()
        spark.stop()
        print("DRIVER stopped", flush=True)
        time.sleep(WAIT_LIMIT_S)
        return 0
    q = writer.trigger(processingTime="100 milliseconds").start()
    print("DRIVER query started", flush=True)
    while q.isActive:
        time.sleep(0.5)
    print(f"DRIVER query ended: {q.exception()}", flush=True)
    return 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("rescale")
    r.add_argument("checkpoint")
    r.add_argument("partitions", type=int)
    r.add_argument("--output")
    r.add_argument("--in-place", action="store_true")
    w = sub.add_parser("wait")
    w.add_argument("go_file")
    q = sub.add_parser("query")
    q.add_argument("input")
    q.add_argument("checkpoint")
    q.add_argument("partitions", type=int)
    q.add_argument("--once", action="store_true")
    args = parser.parse_args(argv[1:])
    return query(args) if args.command == "query" else rescale(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
