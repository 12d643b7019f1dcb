"""Small micro-batches on a large state: what a batch costs should follow the keys it touches.

Per key, the state of ``state_api_bench.py``'s logic: a count (ValueState), the last 10 events
(ListState), totals per category (MapState). Each run first builds a state of ``N`` keys (one
micro-batch with one event per key, its own query run), waits until the checkpoint has no more
writes (the build's background snapshot upload), then restarts with ``--batches`` micro-batches
of ``--update-keys`` events of existing keys (one more, unmeasured and reported apart: the first
batch after the bulk load, where keyedstate snapshots the built state). Per update batch it
measures the bytes written under the checkpoint's ``state/`` directory (in the sink, after the
batch's state commits; a background snapshot upload lands in a later batch, so the mean includes
the update batches' own snapshots) and the batch's duration.

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
from bench_support import (
    SPARK_ROCKSDB,
    BatchLog,
    WrittenBytes,
    load_average,
    median,
    run_batches,
    session,
)
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


def events(rng: np.random.Generator, ids: np.ndarray, first_seq: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": [f"u{k:08d}" for k in ids],
            "seq": np.arange(first_seq, first_seq + len(ids), dtype=np.int64),
            "category": np.array(CATEGORIES)[rng.integers(0, len(CATEGORIES), len(ids))],
            "amount": rng.integers(1, 1000, len(ids)).astype(np.int64),
        }
    )


def write_build(directory: Path, keys: int, files: int, seed: int) -> None:
    """The build batch: every key once, ``files`` files (one at a time: 10M Python strings at
    once would be a lot of memory)."""
    rng = np.random.default_rng(seed)
    for i, ids in enumerate(np.array_split(np.arange(keys), files)):
        write_input(events(rng, ids, int(ids[0])), directory, 1, first_file=i, mtime=1_600_000_000)


def write_updates(
    directory: Path, keys: int, update_keys: int, batches: int, files: int, seed: int
) -> None:
    """``batches`` batches of ``update_keys`` distinct existing keys, ``files`` files each; file
    times order the batches."""
    rng = np.random.default_rng(seed + 1)
    for batch in range(batches):
        ids = rng.choice(keys, size=update_keys, replace=False)
        write_input(
            events(rng, ids, keys + batch * update_keys),
            directory,
            files,
            first_file=files * (batch + 1),
            mtime=1_600_001_000 + batch,
        )


def wait_until_quiet(root: Path, quiet_s: float = 5.0, limit_s: float = 600.0) -> None:
    """Until no file under ``root`` changed for ``quiet_s`` (background snapshot uploads done)."""
    deadline = time.monotonic() + limit_s
    written = WrittenBytes(root)
    written.delta()
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1)
        if written.delta():
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return


def run(
    spark: SparkSession,
    name: str,
    provider: str,
    keys: int,
    args: argparse.Namespace,
    workdir: Path,
) -> tuple[str, BatchLog, float]:
    """Builds the state (its own run), waits for its uploads, then runs the update batches as a
    restart: the bytes measured are the update batches' own."""
    input_dir = workdir / f"input-{name}"
    checkpoint = workdir / f"ckpt-{name}"
    print(f"[bench] {name}: building {keys:,} keys ...", flush=True)
    write_build(input_dir, keys, args.partitions, args.seed)
    source = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", args.partitions)
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
    build = run_batches(spark, frame, provider, checkpoint)
    wait_until_quiet(checkpoint / "state")
    print(f"[bench] {name}: {args.batches} update batches ...", flush=True)
    # One settling batch more than measured, for every run alike: after a bulk load of the whole
    # state, keyedstate's first commit snapshots it (its changelogs hold more records than the
    # state has keys), a one-time cost of the build that is reported apart.
    write_updates(input_dir, keys, args.update_keys, args.batches + 1, args.partitions, args.seed)
    log = run_batches(spark, frame, provider, checkpoint)
    log.duration_ms[0] = build.duration_ms.get(0, 0)
    shutil.rmtree(input_dir, ignore_errors=True)
    return name, log, 0.0


def summary(log: BatchLog, update_keys: int) -> tuple[float, float, float, float]:
    updates = [b for b in sorted(log.rows) if b > 1]  # batch 0 builds, batch 1 settles
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
            results.append((keys, *run(spark, name, provider, keys, args, workdir)))
            shutil.rmtree(workdir / f"ckpt-{name}", ignore_errors=True)
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
        per_batch = [log.bytes[b] // 1000 for b in sorted(log.bytes) if b > 1]
        print(f"{'':<28} settling batch: {log.bytes.get(1, 0) // 1000:,} KB, "
              f"{log.duration_ms.get(1, 0):,} ms; KB per measured batch: {per_batch}")  # fmt: skip
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
