"""Savepoint benchmark: native and canonical savepoints and their restores against copying the
checkpoint folder, and ``keyedstate.state.read`` against Spark's ``statestore`` reader.

One process, one local[2] session on keyedstate's provider (and, for the CLI's savepoints, the
CLI's own processes):

1. builds an aggregation's state of ``--keys`` keys on ``--partitions`` partitions (one batch of
   every key, then ``--batches`` small batches, so the last version is a snapshot and changelogs);
2. times ``keyedstate.savepoint`` (a Spark job copying each partition's version, checked
   against its CRC32C) against ``shutil.copytree`` of the whole checkpoint folder (which also
   copies retained older versions, logs and Spark's metadata), and reports both sizes;
3. times ``restore_savepoint`` at the same count (a copy) and at twice the count (a rescale);
4. the same for a canonical savepoint (every key written as Parquet, then through the provider);
5. restarts the query on each restored checkpoint with one more batch and checks its key count;
6. reads the whole state (every row's key and value hashed and summed) with ``state.read`` and
   with Spark's ``statestore`` reader, and checks both give the same sum;
7. runs the query again on its checkpoint with small processing-time batches (1000 new keys
   each) and reports its median batch time before any savepoint, and for the batches that
   overlap one of 25 single native savepoints, or one of 3 canonical ones, taken in the query's
   application 2.5 s apart (the same two cores serve the query and the savepoints); of 12 native
   savepoints the CLI takes (``keyedstate savepoint create``: it asks the query's application
   through the query service), and of 5 it takes in a Spark application of its own
   (``--in-this-process``, at its default low CPU priority), each from the CLI's start to its
   exit. Each is compared with the batches of the same run that overlapped no savepoint
   (median, p90 and max). Last, native savepoints taken one after the other for 20 s.

Prints a table and the load average (the machine is shared). Usage:

    python bench/savepoint_bench.py [--keys 1000000] [--partitions 4] [--batches 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import keyedstate  # noqa: E402
from bench_support import session  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

SCHEMA = "key long, v int"


def write_batch(spark: SparkSession, folder: Path, name: str, start: int, count: int) -> None:
    files = max(1, min(8, count // 500_000))
    frame = spark.range(start, start + count, numPartitions=files)
    frame.select(
        F.col("id").alias("key"), (F.col("id") % 7 + 1).cast("int").alias("v")
    ).write.parquet(str(folder / name))


def run_to_end(spark: SparkSession, inputs: Path, checkpoint: Path) -> dict:
    stream = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 64)
        .parquet(str(inputs / "*" / "*.parquet"))
    )
    agg = stream.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    query = (
        agg.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return query.lastProgress["stateOperators"][0]


def dir_bytes(folder: Path) -> int:
    return sum(
        p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".crc")
    )


def timed(f):  # noqa: ANN001, ANN201
    began = time.perf_counter()
    result = f()
    return result, time.perf_counter() - began


Batch = tuple[float, float, float]  # a small query's batch: start, end (epoch seconds), ms


def batch_times_while(
    spark: SparkSession,
    inputs: Path,
    checkpoint: Path,
    first_key: int,
    actions: list[Callable[[], None]],
) -> tuple[list[float], list[list[Batch]]]:
    """The big query itself, run again on its checkpoint with small processing-time batches (a
    file of 1000 new keys every 0.5 s, one file per batch): its batch times (ms) before the
    ``actions``, and its batches while each runs, one after the other."""
    stream = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inputs / "*" / "*.parquet"))
    )
    agg = stream.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    stop = threading.Event()

    def feed() -> None:
        i = 0
        while not stop.is_set():
            write_batch(spark, inputs, f"small-{i:05d}", first_key + i * 1000, 1000)
            i += 1
            time.sleep(0.5)

    feeder = threading.Thread(target=feed, daemon=True)
    query = (
        agg.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )
    feeder.start()
    try:
        time.sleep(40)  # warm-up (the query settles on its restored state) and a baseline
        before = [
            p["durationMs"]["triggerExecution"]
            for p in query.recentProgress
            if p["numInputRows"] > 0
        ]
        during = []
        for action in actions:
            began = time.time()
            action()
            # By time, not by index: the query keeps only its last 100 progress reports.
            during.append(
                [
                    (start, start + ms / 1000, ms)
                    for p in query.recentProgress
                    if p["numInputRows"] > 0
                    for ms in [p["durationMs"]["triggerExecution"]]
                    for start in [dt.datetime.fromisoformat(p["timestamp"]).timestamp()]
                    if start >= began
                ]
            )
    finally:
        stop.set()
        feeder.join()
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return before[-10:], during


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keyedstate-savepoint-bench-"))
    spark = session("keyedstate savepoint bench", args.partitions)
    try:
        inputs, checkpoint = work / "input", work / "checkpoint"
        write_batch(spark, inputs, "b0", 0, args.keys)
        run_to_end(spark, inputs, checkpoint)
        for b in range(args.batches):  # small batches: changelogs on top of the first snapshot
            write_batch(spark, inputs, f"b{b + 1}", b * 1000, 1000)
            run_to_end(spark, inputs, checkpoint)
        load = os.getloadavg()
        rows = []
        info, took = timed(
            lambda: keyedstate.savepoint(spark, str(checkpoint), str(work / "savepoint"))
        )
        _, copy_s = timed(lambda: shutil.copytree(checkpoint, work / "copied"))
        rows.append(("savepoint (native)", took, info.bytes, f"{info.files} files"))
        rows.append(
            ("copy of the checkpoint folder", copy_s, dir_bytes(work / "copied"), "shutil.copytree")
        )
        canonical, took = timed(
            lambda: keyedstate.savepoint(
                spark, str(checkpoint), str(work / "canonical"), format="canonical"
            )
        )
        rows.append(("savepoint (canonical)", took, canonical.bytes, f"{canonical.files} files"))
        for fmt, folder in (("native", "savepoint"), ("canonical", "canonical")):
            for name, partitions in (
                (f"restore {fmt}, same count", None),
                (f"restore {fmt}, twice the count", args.partitions * 2),
            ):
                target = work / f"restored-{fmt}-{partitions}"
                result, took = timed(
                    lambda t=target, p=partitions, f=folder: keyedstate.restore_savepoint(
                        spark, str(work / f), str(t), partitions=p
                    )
                )
                after = f"after-{fmt}-{partitions}"
                write_batch(spark, inputs, after, args.keys, 1000)  # 1000 new keys
                state = run_to_end(spark, inputs, target)
                shutil.rmtree(inputs / after)
                expected = args.keys + 1000
                total = state["numRowsTotal"]
                check = "ok" if total == expected else f"WRONG {total}"
                rows.append((name, took, dir_bytes(target), f"restarted: {total} keys, {check}"))
                # The stopped query's stores release their leases in the background.
                shutil.rmtree(target, ignore_errors=True)
        keyedstate.dispose_savepoint(spark, str(work / "savepoint"))
        keyedstate.dispose_savepoint(spark, str(work / "canonical"))

        def whole_state(frame) -> int:  # noqa: ANN001 - a DataFrame
            return frame.agg(F.sum(F.hash("key", "value").cast("long"))).first()[0]

        ours, ours_s = timed(lambda: whole_state(keyedstate.state.read(spark, str(checkpoint))))
        spark_s_sum, spark_s = timed(
            lambda: whole_state(spark.read.format("statestore").load(str(checkpoint)))
        )
        reads = (ours_s, spark_s, "same" if ours == spark_s_sum else "DIFFERENT")
        taken = []

        def savepoints_for(seconds: float) -> None:
            """Native savepoints of the running query one after the other, for a while."""
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                target = work / f"savepoint-{len(taken)}"
                taken.append(
                    timed(lambda t=target: keyedstate.savepoint(spark, str(checkpoint), str(t)))[1]
                )
                shutil.rmtree(target)

        spaced: dict[str, list[tuple[float, float]]] = {"native": [], "canonical": []}

        def one_savepoint_at_a_time(count: int, pause: float, fmt: str) -> None:
            """Single savepoints of the running query with pauses between them: the batches
            that overlap one show what one savepoint costs the query."""
            for i in range(count):
                target = work / f"single-{fmt}-{i}"
                began = time.time()
                keyedstate.savepoint(spark, str(checkpoint), str(target), format=fmt)
                spaced[fmt].append((began, time.time()))
                shutil.rmtree(target)
                time.sleep(pause)

        def cli_savepoints(count: int, pause: float, fmt: str, where: str) -> None:
            """Savepoints of the running query by the CLI, one at a time, its whole run (start
            to exit) the window: by default the CLI asks the query's application (the query
            service); ``--in-this-process`` starts a Spark application of its own (at its
            default low CPU priority) beside the query."""
            for i in range(count):
                target = work / f"cli-{fmt}-{where}-{i}"
                began = time.time()
                done = subprocess.run(
                    [sys.executable, "-m", "keyedstate.tools.cli", "savepoint", "create",
                     "--checkpoint", str(checkpoint), "--target", str(target), "--format", fmt,
                     "--master", "local[2]",
                     *(["--in-this-process"] if where == "own process" else [])],
                    check=True, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                asked = "the savepoint is taken there" in done.stdout
                assert asked == (where == "query's app"), done.stdout
                spaced[f"CLI {fmt}, {where}"].append((began, time.time()))
                shutil.rmtree(target)
                time.sleep(pause)

        for where in ("query's app", "own process"):
            spaced[f"CLI native, {where}"] = []
        before_ms, (*spaced_runs, during) = batch_times_while(
            spark,
            inputs,
            checkpoint,
            args.keys * 2,
            [
                lambda: one_savepoint_at_a_time(25, 2.5, "native"),
                lambda: one_savepoint_at_a_time(3, 2.5, "canonical"),
                lambda: cli_savepoints(12, 2.5, "native", "query's app"),
                lambda: cli_savepoints(5, 2.5, "native", "own process"),
                lambda: savepoints_for(20),
            ],
        )
        before = statistics.median(before_ms)
        back_to_back = statistics.median([ms for _, _, ms in during] or [0])

        def overlapping(batches: list[Batch], windows: list[tuple[float, float]]) -> list[float]:
            return [
                ms for start, end, ms in batches
                if any(s < end and start < e for s, e in windows)
            ]

        every_window = [w for windows in spaced.values() for w in windows]
        quiet = sorted(
            ms for batches in spaced_runs for start, end, ms in batches
            if not overlapping([(start, end, ms)], every_window)
        )
        baseline = statistics.median(quiet)

        def p90(values: list[float]) -> float:
            return sorted(values)[min(len(values) - 1, int(0.9 * len(values)))]

        print(
            f"\nsavepoint bench: {args.keys:,} keys, {args.partitions} partitions, "
            f"{args.batches} batches after the first; "
            f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
        )
        print(f"{'what':<34}{'seconds':>9}{'bytes':>15}  notes")
        for name, seconds, size, notes in rows:
            print(f"{name:<34}{seconds:>9.2f}{size:>15,}  {notes}")
        print(
            f"savepoint / folder copy: time {rows[0][1] / rows[1][1]:.2f}x, "
            f"bytes {rows[0][2] / rows[1][2]:.2f}x; canonical: "
            f"time {rows[2][1] / rows[1][1]:.2f}x, bytes {rows[2][2] / rows[1][2]:.2f}x"
        )
        print(
            f"reading the whole state: state.read {reads[0]:.2f} s, Spark's statestore reader "
            f"{reads[1]:.2f} s ({reads[1] / reads[0]:.2f}x state.read's time; rows {reads[2]})"
        )
        print(
            f"the running query's batch (1000 rows on {args.keys:,} keys): median "
            f"{before:.0f} ms in the warm-up before any savepoint; over the "
            f"{len(quiet)} batches between the single savepoints below: median "
            f"{baseline:.0f} ms, p90 {p90(quiet):.0f} ms, max {quiet[-1]:.0f} ms (the base)"
        )
        print(
            f"while native savepoints of it are taken one after the other: median "
            f"{back_to_back:.0f} ms ({back_to_back / baseline:.2f}x; {len(taken)} savepoints, "
            f"median {statistics.median(taken):.2f} s)"
        )
        for (name, windows), batches in zip(spaced.items(), spaced_runs, strict=True):
            hit = overlapping(batches, windows)
            if hit:
                single = statistics.median(hit)
                print(
                    f"the batches that overlap one of {len(windows)} single savepoints ({name}) "
                    f"(2.5 s apart): median {single:.0f} ms ({single / baseline:.2f}x), "
                    f"p90 {p90(hit):.0f} ms ({p90(hit) / p90(quiet):.2f}x), max {max(hit):.0f} "
                    f"ms; {len(hit)} batches: {', '.join(f'{ms:.0f}' for ms in hit)}"
                )
        return 0
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
