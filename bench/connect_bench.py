"""Spark Connect against a classic session: what a keyed function costs per micro-batch when its
query is started from a Connect client.

The same keyed function (bench/state_api_bench.py's ``UserActivity``: a value, a list and a map
state per user) runs over the same input in two applications, each in its own process, in
``--rounds`` rounds of alternating order:

* ``classic``: a classic session (py4j), ``local[2]``;
* ``connect``: a Spark Connect client of a server it starts in its process
  (``SparkSession.builder.remote("local[2]")``, through ``keyedstate.configure``).

Each run writes ``--batches`` input files of ``--events`` events over ``--keys`` users, one file
per micro-batch (a processing-time trigger of 200 ms), after a warm-up query of the same shape.
Reported, side by side: the query's start (from ``start()`` to its first committed batch), the
median batch time (Spark's ``triggerExecution``), and the wall time of the whole run.

    python bench/connect_bench.py                 # 2 rounds, 20 batches of 2,000 events
    python bench/connect_bench.py --rounds 1 --batches 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("classic", "connect")


def run(mode: str, work: Path, events: int, keys: int, batches: int) -> dict[str, float]:
    """One application of ``mode``: a warm-up query, then the measured one."""
    import keyedstate
    import numpy as np
    import pandas as pd
    import state_api_bench
    from bench_support import median
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession
    from state_api_bench import UserActivity

    cloudpickle.register_pickle_by_value(state_api_bench)  # the workers need not import it

    builder = SparkSession.builder.config("spark.sql.shuffle.partitions", "4")
    if mode == "classic":
        builder = builder.master("local[2]").config("spark.ui.enabled", "false")
    else:
        builder = builder.remote("local[2]")
    spark = keyedstate.configure(builder).getOrCreate()
    output = "user_id string, seq long, count long, category_total long, recent_sum long"
    rng = np.random.default_rng(7)

    def write(source: Path, index: int) -> None:
        frame = pd.DataFrame(
            {
                "user_id": [f"u{k:07d}" for k in rng.integers(0, keys, events)],
                "seq": np.arange(index * events, (index + 1) * events, dtype=np.int64),
                "category": rng.choice(["a", "b", "c"], events),
                "amount": rng.integers(1, 100, events),
            }
        )
        tmp = source.parent / f".{source.name}-{index:05d}.parquet"
        frame.to_parquet(tmp)
        os.replace(tmp, source / f"{index:05d}.parquet")

    def query(name: str, count: int) -> dict[str, float]:
        source, checkpoint = work / f"{name}-in", work / f"{name}-checkpoint"
        source.mkdir()
        stream = (
            spark.readStream.schema("user_id string, seq long, category string, amount long")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
        )
        frame = keyedstate.key_by(stream, "user_id").process(UserActivity(), output)
        write(source, 0)
        began = time.perf_counter()
        started = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        commits = checkpoint / "commits"
        while not (commits / "0").exists():
            time.sleep(0.01)
        first = time.perf_counter() - began
        for index in range(1, count):
            write(source, index)
            while not (commits / str(index)).exists():
                time.sleep(0.01)
        wall = time.perf_counter() - began
        time.sleep(0.5)  # the last progress events arrive
        times = [
            p.durationMs["triggerExecution"]
            for p in started.recentProgress
            if p.numInputRows > 0 and p.batchId > 0
        ]
        started.stop()
        return {"first_batch_s": first, "batch_ms": median(times), "wall_s": wall}

    query("warmup", max(3, batches // 4))
    result = query("measured", batches)
    spark.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one run, in a child
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode is not None:
        with tempfile.TemporaryDirectory(prefix=f"connect-bench-{args.mode}-") as work:
            result = run(args.mode, Path(work), args.events, args.keys, args.batches)
        Path(args.out).write_text(json.dumps(result))
        return

    from bench_support import load_average, median

    print(f"start: {load_average()}", flush=True)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="connect-bench-") as work:
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                out = Path(work) / f"{mode}-{round_}.json"
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--mode",
                        mode,
                        "--out",
                        str(out),
                        "--batches",
                        str(args.batches),
                        "--events",
                        str(args.events),
                        "--keys",
                        str(args.keys),
                    ],  # fmt: skip
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                results[mode].append(json.loads(out.read_text()))
                print(f"round {round_} {mode}: {results[mode][-1]} ({load_average()})", flush=True)
    print(
        f"\n{args.batches} micro-batches of {args.events:,} events over {args.keys:,} keys, "
        f"{args.rounds} rounds; {load_average()}"
    )
    figures = {m: {k: median([r[k] for r in rs]) for k in rs[0]} for m, rs in results.items()}
    for key, label in (
        ("first_batch_s", "start() to the first batch committed (s)"),
        ("batch_ms", "median batch time (ms)"),
        ("wall_s", "the whole run (s)"),
    ):
        classic, connect = figures["classic"][key], figures["connect"][key]
        print(f"{label}: classic {classic:.2f}, connect {connect:.2f}: {connect / classic:.2f}x")


if __name__ == "__main__":
    main()
