"""Small micro-batches on a large state: what a batch costs should follow the keys it touches.

Per key, the state of ``state_api_bench.py``'s logic: a count (ValueState), the last 10 events
(ListState), totals per category (MapState). Each run first builds a state of ``N`` keys (one
micro-batch with one event per key), then runs ``--batches`` micro-batches of ``--update-keys``
events of existing keys. Per update batch it measures the bytes written under the checkpoint's
``state/`` directory (in the sink, after the batch's state commits; background snapshot uploads
land in a later batch, so the mean includes them) and the batch's duration.

Runs, side by side in one process:

* keyedstate's API on keyedstate's provider with ``--keys`` keys (10M by default);
* the same with ``--small-keys`` keys (100k): the batch-time reference;
* ``transformWithStateInPandas`` (same logic, same three states) on Spark's RocksDB provider with
  ``--tws-keys`` keys (100k by default: building a 10M-key state through its per-key socket calls
  would take hours; its bytes per batch follow the updated keys, not the state's size).

Goals (issue 10): bytes per update batch at 10M keys <= 2x transformWithStateInPandas's for the
same updates; batch time at 10M keys <= 1.5x the same batch at 100k keys.

    python bench/small_batch_bench.py                                  # the documented run
    python bench/small_batch_bench.py --keys 1000000 --batches 10      # quicker
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import keyedstate
import numpy as np
import pandas as pd
import state_api_bench
from bench_support import SPARK_ROCKSDB, BatchLog, load_average, median, run_batches, session
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from state_api_bench import (
    CATEGORIES,
    INPUT_SCHEMA,
    OUTPUT_DDL,
    UserActivity,
    UserActivityProcessor,
    write_input,
)

# The workers cannot import the bench modules: ship their functions by value.
cloudpickle.register_pickle_by_value(state_api_bench)


def prepare(
    directory: Path, keys: int, update_keys: int, batches: int, files: int, seed: int
) -> None:
    """One build batch (every key once) then ``batches`` update batches of ``update_keys``
    distinct existing keys; each batch is ``files`` files, and file times order the batches."""
    rng = np.random.default_rng(seed)

    def events(ids: np.ndarray, first_seq: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "user_id": [f"u{k:08d}" for k in ids],
                "seq": np.arange(first_seq, first_seq + len(ids), dtype=np.int64),
                "category": np.array(CATEGORIES)[rng.integers(0, len(CATEGORIES), len(ids))],
                "amount": rng.integers(1, 1000, len(ids)).astype(np.int64),
            }
        )

    # One file at a time: 10M Python strings at once would be a lot of memory.
    for i, ids in enumerate(np.array_split(np.arange(keys), files)):
        write_input(events(ids, int(ids[0])), directory, 1, first_file=i, mtime=1_600_000_000)
    for batch in range(batches):
        ids = rng.choice(keys, size=update_keys, replace=False)
        write_input(
            events(ids, keys + batch * update_keys),
            directory,
            files,
            first_file=files * (batch + 1),
            mtime=1_600_001_000 + batch,
        )


def run(
    spark: SparkSession, name: str, provider: str, input_dir: Path, files: int, workdir: Path
) -> tuple[str, BatchLog, float]:
    source = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", files)
        .parquet(str(input_dir))
    )
    if name.startswith("keyedstate"):
        frame = keyedstate.key_by(source, "user_id", order_by="seq").process(
            UserActivity(), OUTPUT_DDL
        )
    else:
        frame = source.groupBy("user_id").transformWithStateInPandas(
            statefulProcessor=UserActivityProcessor(),
            outputStructType=OUTPUT_DDL,
            outputMode="Append",
            timeMode="None",
        )
    print(f"[bench] {name} ...", flush=True)
    started = time.perf_counter()
    log = run_batches(spark, frame, provider, workdir / f"ckpt-{name}")
    return name, log, time.perf_counter() - started


def summary(log: BatchLog, update_keys: int) -> tuple[float, float, float, float]:
    updates = [b for b in sorted(log.rows) if b > 0]
    assert all(log.rows[b] == update_keys for b in updates), log.rows
    bytes_ = [log.bytes[b] for b in updates]
    times = [log.duration_ms[b] for b in updates if b in log.duration_ms]
    return (sum(bytes_) / len(bytes_), median(bytes_), median(times), sum(times) / len(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--small-keys", type=int, default=100_000)
    parser.add_argument("--tws-keys", type=int, default=100_000)
    parser.add_argument("--update-keys", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--skip-tws", action="store_true")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="keyedstate-small-batch-bench-"))
    try:
        spark = session("keyedstate-small-batch-bench", args.partitions)
        plan = [
            ("keyedstate-small", keyedstate.PROVIDER_CLASS, args.small_keys),
            ("keyedstate-large", keyedstate.PROVIDER_CLASS, args.keys),
        ]
        if not args.skip_tws:
            plan.insert(1, ("transformWithStateInPandas", SPARK_ROCKSDB, args.tws_keys))
        results = []
        for name, provider, keys in plan:
            input_dir = workdir / f"input-{name}"
            prepare(input_dir, keys, args.update_keys, args.batches, args.partitions, args.seed)
            results.append((keys, *run(spark, name, provider, input_dir, args.partitions, workdir)))
            shutil.rmtree(workdir / f"input-{name}", ignore_errors=True)
        spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(
        f"{args.batches} update batches of {args.update_keys} keys; {args.partitions} partitions;"
        f" local[2]; {load_average()}"
    )
    header = (
        f"{'run':<28} {'state keys':>11} {'build s':>8} {'bytes/batch mean':>17} "
        f"{'median':>10} {'batch ms median':>16} {'mean':>8}"
    )
    print(header)
    print("-" * len(header))
    stats = {}
    for keys, name, log, _ in results:
        mean_bytes, median_bytes, median_ms, mean_ms = summary(log, args.update_keys)
        stats[name] = (mean_bytes, median_ms)
        print(
            f"{name:<28} {keys:>11,} {log.duration_ms.get(0, 0) / 1000:8.1f} "
            f"{mean_bytes:17,.0f} {median_bytes:10,.0f} {median_ms:16,.0f} {mean_ms:8,.0f}"
        )
    large, small = stats["keyedstate-large"], stats["keyedstate-small"]
    print()
    print(f"batch time, {args.keys:,} keys / {args.small_keys:,} keys (median): "
          f"{large[1] / small[1]:.2f}x (goal <= 1.5x)")  # fmt: skip
    if "transformWithStateInPandas" in stats:
        tws = stats["transformWithStateInPandas"]
        print(
            f"bytes per batch, keyedstate at {args.keys:,} keys / transformWithStateInPandas at "
            f"{args.tws_keys:,} keys (means): {large[0] / tws[0]:.2f}x (goal <= 2x)"
        )


if __name__ == "__main__":
    main()
