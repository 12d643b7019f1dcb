"""What making a state queryable costs the query itself, without any lookup (issue 34).

Two queries run side by side in one application, each with its own input and checkpoint: the
keyed function of bench/queryable_bench.py with its state queryable (each commit writes the
batch's buffered writes into RocksDB's memtables and takes a snapshot the state server reads),
and the same function without ``set_queryable``. Both load ``--keys`` keys, then take
``--batches`` batches of ``--updates`` updates in turn, in alternating order; reported: the
median batch time of each and their ratio.

    python bench/queryable_cost_bench.py                # the documented run
    python bench/queryable_cost_bench.py --keys 100000 --updates 10000 --batches 4
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import keyedstate
import numpy as np
from bench_support import PROVIDER_KEY, load_average, median, session
from pyspark.sql.streaming import StreamingQuery
from queryable_bench import OUTPUT, Totals, await_batch, durations, events, write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--load-batches", type=int, default=5)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="queryable-cost-bench-"))
    spark = session("queryable-cost-bench", args.partitions)
    spark.conf.set(PROVIDER_KEY, keyedstate.PROVIDER_CLASS)
    print(f"start: {load_average()}", flush=True)
    jobs = {"queryable": Totals(), "not queryable": Totals(queryable=False)}
    runs: dict[str, tuple[StreamingQuery, Path, Path]] = {}
    batches = {name: -1 for name in jobs}
    rng = np.random.default_rng(11)
    try:
        for name, function in jobs.items():
            source, checkpoint = work / name / "input", work / name / "checkpoint"
            source.mkdir(parents=True)
            stream = spark.readStream.schema("user string, amount long")
            frame = keyedstate.key_by(
                stream.option("maxFilesPerTrigger", 1).parquet(str(source)), "user"
            ).process(function, OUTPUT, uid="totals")
            query = (
                frame.writeStream.format("noop")
                .option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="100 milliseconds")
                .start()
            )
            runs[name] = (query, source, checkpoint)

        def step(name: str, table: Any) -> None:  # noqa: ANN401 - a pyarrow table
            query, source, checkpoint = runs[name]
            batches[name] += 1
            write(table, source, batches[name])
            await_batch(query, checkpoint, batches[name])

        per_load = -(-args.keys // args.load_batches)
        for i in range(args.load_batches):
            table = events(np.arange(i * per_load, min(args.keys, (i + 1) * per_load)), rng)
            for name in jobs:
                step(name, table)
        first = {name: batches[name] + 1 for name in jobs}
        for b in range(args.batches):
            table = events(rng.integers(0, args.keys, args.updates), rng)
            for name in list(jobs) if b % 2 == 0 else list(jobs)[::-1]:
                step(name, table)
        measured = {}
        for name, (query, _, _) in runs.items():
            times = durations(query)
            measured[name] = median(
                [times[b] for b in range(first[name], batches[name] + 1) if b in times]
            )
    finally:
        for query, _, _ in runs.values():
            query.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.keys:,} keys, {args.partitions} partitions, {args.updates:,} updates per batch, "
        f"{args.batches} batches each; {load_average()}"
    )
    for name, ms in measured.items():
        print(f"{name}: median batch {ms:.0f} ms")
    ratio = measured["queryable"] / measured["not queryable"]
    print(f"queryable / not queryable: {ratio:.3f}x")


if __name__ == "__main__":
    main()
