"""Memory bound: ``heapWriteBufferMB`` holds for 200 state partitions in a 1 GB JVM.

One local[2] session with a 1 GB driver heap, 200 shuffle (state) partitions and
``heapWriteBufferMB=64``, runs a streaming aggregation that keeps a 200-byte string per key over
``--batches`` batches of ``--rows`` new keys each (the state's writes wait in the heap's buffers
between snapshots, so without a bound they would grow batch after batch). A thread samples the
executor-wide total of the write buffers (``LocalRocksDB.bufferedBytesInJvm``, which counts
every buffer, live and frozen, a little ahead of what it holds) and the JVM's used heap every
20 ms. It reports the largest of each against the bound and checks the query's key count.

    python bench/memory_bound_bench.py [--rows 1000000] [--batches 4] [--bound-mb 64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import keyedstate  # noqa: E402
from bench_support import session  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

PARTITIONS = 200


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000, help="new keys per batch")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--bound-mb", type=int, default=64)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keyedstate-memory-bench-"))
    conf = {keyedstate.OPTION_PREFIX + "heapWriteBufferMB": str(args.bound_mb)}
    spark = session("keyedstate memory bound bench", PARTITIONS, memory="1g", conf=conf)
    jvm = spark._jvm
    runtime = jvm.java.lang.Runtime.getRuntime()
    # keyedstate's jar is on spark.jars: its classes are in the context class loader.
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    rocks = jvm.java.lang.Class.forName("io.keyedstate.rocks.LocalRocksDB$", True, loader)
    local_rocksdb = rocks.getField("MODULE$").get(None)
    peaks = {"buffers": 0, "heap": 0}
    failures: list[BaseException] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.is_set():
                buffered = local_rocksdb.bufferedBytesInJvm()
                used = runtime.totalMemory() - runtime.freeMemory()
                peaks["buffers"] = max(peaks["buffers"], buffered)
                peaks["heap"] = max(peaks["heap"], used)
                time.sleep(0.02)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        inputs = work / "input"
        for b in range(args.batches):
            frame = spark.range(b * args.rows, (b + 1) * args.rows, numPartitions=4)
            frame.select(
                F.col("id").alias("key"), F.sha2(F.col("id").cast("string"), 512).alias("payload")
            ).write.parquet(str(inputs / f"b{b}"))
        stream = (
            spark.readStream.schema("key long, payload string")
            .option("maxFilesPerTrigger", 4)
            .parquet(str(inputs / "*" / "*.parquet"))
        )
        agg = stream.groupBy("key").agg(F.max(F.concat("payload", "payload")).alias("longest"))
        load = os.getloadavg()
        sampler.start()
        began = time.perf_counter()
        query = (
            agg.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        took = time.perf_counter() - began
        stop.set()
        sampler.join()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        if failures:
            raise RuntimeError(f"the sampler failed: {failures[0]}")
        keys = query.lastProgress["stateOperators"][0]["numRowsTotal"]
        bound = args.bound_mb * 1024 * 1024
        max_heap = runtime.maxMemory()
        print(
            f"\nmemory bound bench: {PARTITIONS} state partitions, {args.batches} batches of "
            f"{args.rows:,} new keys (a 256-byte string each), heapWriteBufferMB={args.bound_mb}, "
            f"JVM heap {max_heap / 2**20:.0f} MB; "
            f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
        )
        expected = args.rows * args.batches
        print(f"finished in {took:.1f} s with {keys:,} keys (expected {expected:,})")
        print(
            f"largest total of the write buffers: {peaks['buffers'] / 2**20:.1f} MB "
            f"({peaks['buffers'] / bound:.2f}x the bound of {args.bound_mb} MB)"
        )
        print(f"largest used heap: {peaks['heap'] / 2**20:.0f} MB of {max_heap / 2**20:.0f} MB")
        return 0 if keys == expected else 1
    finally:
        stop.set()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
