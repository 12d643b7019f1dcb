"""Queryable state: lookups of a running query's state by key (issue 34).

A keyed function keeps a running total per user (a value state, queryable as ``totals``). The
bench loads ``--keys`` users into its state (``--load-batches`` micro-batches), then, with the
query still running, measures ``--batches`` micro-batches of ``--updates`` updates each, in
``--rounds`` rounds of two modes in alternating order:

* ``alone``: nothing else runs;
* ``lookups``: a separate process asks ``--rate`` point lookups per second of random users
  through ``keyedstate.QueryableStateClient`` (two threads, each on its own connection).

Reported, side by side in one run:

* lookup latency through the client (p50, p99) with the state loaded and the query running,
  against the only way without queryable state: the state reader (``keyedstate.state.read``)
  filtered to one key, timed ``--reader-runs`` times between rounds;
* freshness: from a batch's commit (its commit-log file's modification time) to the first
  lookup answer reflecting it (per batch of the ``lookups`` mode);
* the running query's batch time under lookups against alone (goal: within 10%).

    python bench/queryable_bench.py                      # the documented run: 10M keys
    python bench/queryable_bench.py --lookups-from checkpoint   # the driver's checkpoint fallback
    python bench/queryable_bench.py --client-cpu 1       # the client on a CPU of its own
    python bench/queryable_bench.py --keys 200000 --updates 20000 --batches 4 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import keyedstate
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_support import PROVIDER_KEY, load_average, median, session
from keyedstate import KeyedProcessFunction, Types, ValueStateDescriptor
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

EVENTS = pa.schema([("user", pa.string()), ("amount", pa.int64())])
OUTPUT = "user string, total long"


class Totals(KeyedProcessFunction):
    """A running total per user, queryable as ``totals`` unless ``queryable=False``."""

    def __init__(self, queryable: bool = True) -> None:
        self.queryable = queryable

    def open(self, runtime_context: Any) -> None:  # noqa: ANN401
        total = ValueStateDescriptor("total", Types.LONG())
        if self.queryable:
            total.set_queryable("totals")
        self.total = runtime_context.get_state(total)

    def process_element(self, value: Any, ctx: Any) -> None:  # noqa: ANN401
        self.total.update((self.total.value() or 0) + value.amount)
        return None


def user(i: int) -> str:
    return f"u{i:09d}"


def write(table: pa.Table, directory: Path, index: int) -> None:
    """One input file, published by a rename so the source never reads half of it."""
    tmp = directory.parent / f".{index:06d}.parquet"
    pq.write_table(table, tmp)
    os.replace(tmp, directory / f"{index:06d}.parquet")


def events(users: np.ndarray, rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {"user": [user(int(i)) for i in users], "amount": rng.integers(1, 100, len(users))},
        schema=EVENTS,
    )


def lookup_load(
    url: str,
    token: str,
    query_id: str,
    keys: int,
    rate: float,
    stop: str,
    out: str,
    cpu: int | None,
) -> None:
    """In its own process (on CPU ``cpu`` alone, if given): ``rate`` lookups per second, paced,
    on two threads, until the file ``stop`` exists; then writes each lookup's (send time,
    latency, batch answered) to ``out``."""
    from keyedstate import QueryableStateClient

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})

    client = QueryableStateClient(url, token, query_id=query_id, timeout=30)
    cpu, began = os.times(), time.monotonic()
    records: list[tuple[float, float, int]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        interval = 2.0 / rate
        start = time.monotonic() + rng.random() * interval
        n = 0
        while not os.path.exists(stop):
            due = start + n * interval
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            sent = time.time()
            t0 = time.perf_counter()
            try:
                answer = client.lookup("totals", [user(rng.randrange(keys))])
                latency = time.perf_counter() - t0
                with lock:
                    records.append((sent, latency, answer.batch))
            except Exception as e:  # noqa: BLE001 - counted, reported
                with lock:
                    errors.append(str(e)[:200])
            n += 1

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = os.times()
    seconds = (done.user - cpu.user) + (done.system - cpu.system)
    Path(out).write_text(
        json.dumps(
            {
                "records": records,
                "errors": errors,
                "cpu_s": seconds,
                "wall_s": time.monotonic() - began,
            }
        )
    )


def await_batch(
    query: StreamingQuery, checkpoint: Path, batch: int, timeout_s: float = 1800
) -> None:
    deadline = time.monotonic() + timeout_s
    while not (checkpoint / "commits" / str(batch)).exists():
        if not query.isActive or time.monotonic() > deadline:
            raise RuntimeError(f"batch {batch} not committed: {query.exception()}")
        time.sleep(0.01)


def durations(query: StreamingQuery) -> dict[int, int]:
    return {p.batchId: p.durationMs.get("triggerExecution", 0) for p in query.recentProgress}


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--load-batches", type=int, default=10)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--reader-runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--lookups-from",
        choices=["executors", "checkpoint"],
        default="executors",
        help="spark.keyedstate.service.lookupsFrom: checkpoint measures the driver's fallback",
    )
    parser.add_argument(
        "--client-cpu",
        type=int,
        help="run the lookups on this CPU alone and Spark on the others, as a client on another "
        "machine would: the batch time then shows what serving the lookups costs the query",
    )
    args = parser.parse_args()
    if args.client_cpu is not None:
        cpus = os.sched_getaffinity(0)
        if args.client_cpu not in cpus or len(cpus) < 2:
            parser.error(f"--client-cpu {args.client_cpu}: this process may use {sorted(cpus)}")
        # Set before Spark starts: the JVM and its Python workers inherit it.
        os.sched_setaffinity(0, cpus - {args.client_cpu})

    work = Path(tempfile.mkdtemp(prefix="queryable-bench-"))
    source, checkpoint = work / "input", work / "checkpoint"
    source.mkdir()
    rng = np.random.default_rng(7)
    spark: SparkSession = session(
        "queryable-bench",
        args.partitions,
        conf={"spark.keyedstate.service.lookupsFrom": args.lookups_from},
    )
    spark.conf.set(PROVIDER_KEY, keyedstate.PROVIDER_CLASS)
    print(f"start: {load_average()}", flush=True)

    stream = spark.readStream.schema("user string, amount long").option("maxFilesPerTrigger", 1)
    frame = keyedstate.key_by(stream.parquet(str(source)), "user").process(
        Totals(), OUTPUT, uid="totals"
    )
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    batch = -1
    try:
        started = time.monotonic()
        per_load = -(-args.keys // args.load_batches)
        for i in range(args.load_batches):
            ids = np.arange(i * per_load, min(args.keys, (i + 1) * per_load))
            batch += 1
            write(events(ids, rng), source, batch)
            await_batch(query, checkpoint, batch)
        print(f"loaded {args.keys:,} keys in {time.monotonic() - started:.0f} s", flush=True)
        address = None
        while address is None:
            address = keyedstate.service.service_address(str(checkpoint))
            time.sleep(0.05)

        modes = ["alone", "lookups"]
        batch_ms: dict[str, list[int]] = {m: [] for m in modes}
        latencies: list[float] = []
        freshness_ms: list[float] = []
        reader_s: list[float] = []
        lookup_errors: list[str] = []
        client_cpu_s = client_wall_s = 0.0
        for round_ in range(args.rounds):
            order = modes if round_ % 2 == 0 else modes[::-1]
            for mode in order:
                load = None
                out = str(work / f"lookups-{round_}.json")
                stop = work / f"stop-{round_}"
                first = batch + 1
                if mode == "lookups":
                    load = multiprocessing.get_context("spawn").Process(
                        target=lookup_load,
                        args=(
                            address.url,
                            address.token,
                            address.query_id,
                            args.keys,
                            args.rate,
                            str(stop),
                            out,
                            args.client_cpu,
                        ),  # fmt: skip
                        daemon=True,
                    )
                    load.start()
                    time.sleep(3)  # the process starts and its lookups run before the batches
                for _ in range(args.batches):
                    batch += 1
                    write(events(rng.integers(0, args.keys, args.updates), rng), source, batch)
                    await_batch(query, checkpoint, batch)
                time.sleep(0.5)  # progress events arrive
                times = durations(query)
                batch_ms[mode] += [times[b] for b in range(first, batch + 1) if b in times]
                if load is not None:
                    stop.touch()
                    load.join()
                    result = json.loads(Path(out).read_text())
                    latencies += [lat for _, lat, _ in result["records"]]
                    lookup_errors += result["errors"]
                    client_cpu_s += result["cpu_s"]
                    client_wall_s += result["wall_s"]
                    freshness_ms += freshness(checkpoint, first, batch, out_records(result))
                print(f"round {round_} {mode}: {load_average()}", flush=True)
            for _ in range(args.reader_runs):
                key = user(int(rng.integers(0, args.keys)))
                t0 = time.perf_counter()
                keyedstate.state.read(spark, str(checkpoint), "totals", "total").filter(
                    F.col("user") == key
                ).collect()
                reader_s.append(time.perf_counter() - t0)
    finally:
        query.stop()
        shutil.rmtree(work, ignore_errors=True)

    alone, under = median(batch_ms["alone"]), median(batch_ms["lookups"])
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    reader = median(reader_s)
    fresh, stalest = median(freshness_ms), max(freshness_ms, default=float("nan"))
    first_error = f" (first: {lookup_errors[0]})" if lookup_errors else ""
    print(
        f"\n{args.keys:,} keys, {args.partitions} partitions, {args.updates:,} updates per "
        f"batch, {args.rate:.0f} lookups/s, answered from the {args.lookups_from}; "
        f"{load_average()}"
    )
    print(
        f"lookups: {len(latencies):,} ({len(latencies) / max(client_wall_s, 1e-9):.0f}/s), "
        f"errors {len(lookup_errors)}{first_error}"
    )
    print(f"lookup latency through the client: p50 {1000 * p50:.2f} ms, p99 {1000 * p99:.2f} ms")
    where = "on a CPU of its own" if args.client_cpu is not None else "a process on the same cores"
    print(
        f"the client's own CPU ({where}): "
        f"{1e6 * client_cpu_s / max(1, len(latencies)):.0f} us per lookup"
    )
    print(
        f"state reader filtered to one key: median {reader:.2f} s ({len(reader_s)} runs): "
        f"{reader / p50:,.0f}x the p50 lookup"
    )
    print(
        f"freshness (commit -> first answer reflecting it): median {fresh:.0f} ms, "
        f"max {stalest:.0f} ms over {len(freshness_ms)} batches"
    )
    print(
        f"batch time: alone median {alone:.0f} ms, under lookups {under:.0f} ms: "
        f"{under / alone:.3f}x"
    )


def out_records(result: dict[str, Any]) -> list[tuple[float, float, int]]:
    return [tuple(r) for r in result["records"]]  # type: ignore[misc]


def freshness(
    checkpoint: Path, first: int, last: int, records: list[tuple[float, float, int]]
) -> list[float]:
    """Per batch: ms from its commit-log file's mtime to the first answer (received) at it."""
    out = []
    for b in range(first, last + 1):
        commit = checkpoint / "commits" / str(b)
        if not commit.exists():
            continue
        committed = commit.stat().st_mtime_ns / 1e9
        seen = [
            sent + latency
            for sent, latency, batch in records
            if batch >= b and sent + latency >= committed
        ]
        if seen:
            out.append(1000 * (min(seen) - committed))
    return out


if __name__ == "__main__":
    main()
