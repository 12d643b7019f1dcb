"""Timers at scale: a micro-batch that fires 1,000 of 1M pending timers against one that fires
none (timers are a column family range-scanned by time: a batch reads only what is due).

A ``KeyedProcessFunction`` counts elements per key and registers one event-time timer per key.
The build batch gives ``--keys`` keys (1M) one event each and a timer each, one millisecond
apart. Then ``--batches`` micro-batches of ``--noise-keys`` (1,000) events of other keys (no
timers) alternate between holding the event time (the next batch fires nothing) and advancing
it by ``--due`` ms (the next batch fires exactly ``--due`` timers). Every batch's timer count is
checked; the report compares the median durations of the two kinds of batch.

Goal (issue 10): a batch with 1,000 due timers costs <= 2x a batch with none.

    python bench/timer_bench.py                      # the documented run (1M timers)
    python bench/timer_bench.py --keys 100000        # quicker
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import keyedstate
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from bench_support import load_average, median, run_batches, session
from keyedstate import KeyedProcessFunction, RuntimeContext, Types, ValueStateDescriptor
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("t", LongType()),  # event time, ms
        StructField("timer_at", LongType()),  # null: no timer
    ]
)
T0 = 1_000_000_000
FIRST_TIMER = T0 + 10_000


class TimerKeeper(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        self.count.update((self.count.value() or 0) + 1)
        if value.timer_at is not None:
            ctx.timer_service().register_event_time_timer(value.timer_at)
        return None

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:  # noqa: ANN401
        yield ctx.get_current_key(), timestamp


def write(directory: Path, index: int, frame: pd.DataFrame, files: int) -> None:
    schema = pa.schema([("key", pa.string()), ("t", pa.int64()), ("timer_at", pa.int64())])
    for i, part in enumerate(np.array_split(np.arange(len(frame)), files)):
        path = directory / f"batch-{index:04d}-{i:02d}.parquet"
        table = pa.Table.from_pandas(frame.iloc[part], schema=schema, preserve_index=False)
        pq.write_table(table, path)
        mtime = 1_600_000_000 + index
        os.utime(path, (mtime, mtime))


def prepare(directory: Path, keys: int, batches: int, noise: int, due: int, files: int) -> dict:
    """Writes the batches; returns batch id -> timers it must fire."""
    directory.mkdir(parents=True)
    ids = np.arange(keys)
    write(directory, 0, pd.DataFrame({
        "key": [f"k{k:08d}" for k in ids],
        "t": np.full(keys, T0, dtype=np.int64),
        "timer_at": FIRST_TIMER + ids,
    }), files)  # fmt: skip
    expected = {0: 0, 1: 0}
    event_time = FIRST_TIMER - 1
    for batch in range(1, batches + 1):
        if batch % 2 == 0:
            event_time += due  # the next batch's watermark passes `due` more timers
        frame = pd.DataFrame({
            "key": [f"n{batch:04d}-{j:05d}" for j in range(noise)],
            "t": np.full(noise, event_time, dtype=np.int64),
            "timer_at": pd.array([None] * noise, dtype="Int64"),
        })  # fmt: skip
        write(directory, batch, frame, files)
        expected[batch + 1] = due if batch % 2 == 0 else 0
    expected.pop(batches + 1)
    return expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--noise-keys", type=int, default=1000)
    parser.add_argument("--due", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="keyedstate-timer-bench-"))
    try:
        expected = prepare(
            workdir / "input", args.keys, args.batches, args.noise_keys, args.due, args.partitions
        )
        spark = session("keyedstate-timer-bench", args.partitions)
        events = (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", args.partitions)
            .parquet(str(workdir / "input"))
            .withColumn("ts", F.timestamp_millis("t"))
            .withWatermark("ts", "0 seconds")
        )
        frame = keyedstate.key_by(events, "key").process(TimerKeeper(), "key string, at long")
        fired: dict[int, int] = {}

        def check(batch: int, rows: list[Any]) -> None:
            fired[batch] = len(rows)

        print(f"[bench] building {args.keys:,} keys with a timer each ...", flush=True)
        log = run_batches(spark, frame, keyedstate.PROVIDER_CLASS, workdir / "ckpt", check)
        spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    measured = [b for b in sorted(expected) if b >= 2]
    wrong = {b: (fired.get(b), expected[b]) for b in measured if fired.get(b) != expected[b]}
    if wrong:
        raise SystemExit(f"batches fired the wrong number of timers (got, want): {wrong}")
    with_due = [log.duration_ms[b] for b in measured if expected[b]]
    without = [log.duration_ms[b] for b in measured if not expected[b]]
    print()
    print(
        f"{args.keys:,} pending timers; batches of {args.noise_keys:,} events; "
        f"{args.partitions} partitions; local[2]; {load_average()}"
    )
    print(f"build batch: {log.duration_ms[0] / 1000:.1f} s")
    print(f"batches firing {args.due:,} timers: median {median(with_due):,.0f} ms, {len(with_due)}")
    print(f"batches firing none:        median {median(without):,.0f} ms, {len(without)}")
    print(f"ratio: {median(with_due) / median(without):.2f}x (goal <= 2x)")


if __name__ == "__main__":
    main()
