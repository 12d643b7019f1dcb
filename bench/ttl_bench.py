"""State TTL benchmark: a churn workload under each cleanup strategy and without TTL.

Every batch brings ``--keys-per-batch`` new keys that are never seen again (event time
``10 s x batch``), counted per key by a streaming aggregation (update mode) whose key holds no
event time, so Spark never evicts its state: without TTL it grows forever. With event-time TTL of
``--ttl-batches`` batches, a key is *live* while its last write is younger than the TTL at the
batch's watermark. Each run reports, side by side:

* stored/live: the state's stored keys (``numRowsTotal``, exact) over the live keys, mean and
  max over the batches after the first TTL window (goal: at most 1.2), and at the end;
* throughput: input rows per second of batch time, and its ratio to the run without TTL (goal:
  at least 0.9);
* the entries each strategy removed (the ``ttlRemoved*`` metrics).

    python bench/ttl_bench.py                                   # the documented run
    python bench/ttl_bench.py --batches 50 --keys-per-batch 2000  # quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import keyedstate  # noqa: E402

PREFIX = "spark.sql.streaming.stateStore.keyedstate."
BATCH_SECONDS = 10  # event time between batches


def strategies(keys_per_batch: int, partitions: int, factor: int) -> dict[str, dict[str, str]]:
    """The keyedstate options of each run (TTL duration and time characteristic added later)."""
    # The cursor must outpace the churn: each partition gets about keys_per_batch / partitions
    # new keys per batch; a whole pass over the state takes state / size commits, and expired
    # keys wait for it.
    per_commit = max(1, factor * keys_per_batch // partitions)
    return {
        "no-ttl": {},
        "fullSnapshot": {"ttl.cleanup.fullSnapshot": "true"},
        "incremental": {
            "ttl.cleanup.fullSnapshot": "false",
            "ttl.cleanup.incremental.size": str(per_commit),
        },
        "compaction": {"ttl.cleanup.fullSnapshot": "false", "ttl.cleanup.compaction": "true"},
        "background": {"ttl.cleanup.fullSnapshot": "false", "ttl.cleanup.background": "true"},
    }


TTL_KEYS = ["ttl.duration", "ttl.timeCharacteristic", "ttl.cleanup.fullSnapshot",
            "ttl.cleanup.incremental.size", "ttl.cleanup.compaction", "ttl.cleanup.background"]
METRICS = ["ttlRemovedFullSnapshot", "ttlRemovedIncremental", "ttlRemovedCompaction",
           "ttlRemovedBackground", "ttlExpiredHidden"]


@dataclass
class Result:
    name: str
    rows_per_s: float = 0.0
    ratios: list[float] = field(default_factory=list)  # stored / live, per measured batch
    stored_end: int = 0
    live_end: int = 0
    removed: dict[str, int] = field(default_factory=dict)


def generate(spark: SparkSession, folder: Path, batches: int, keys_per_batch: int) -> None:
    """One parquet file per batch: keys_per_batch new keys at event time 10 s x batch."""
    if (folder / "done").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    for b in range(batches):
        df = spark.range(b * keys_per_batch, (b + 1) * keys_per_batch).select(
            F.col("id").alias("key"), F.lit(b * BATCH_SECONDS).cast("long").alias("t")
        )
        df.coalesce(1).write.parquet(str(folder / f"batch-{b:04d}"))
    (folder / "done").touch()


def live_keys(fed: int, watermark_s: int, keys_per_batch: int, ttl_s: int) -> int:
    """Keys of the `fed` input batches not expired at `watermark_s`: the keys of input batch i
    were written (and stamped) at i's watermark, the largest event time of the batches before."""
    def wm(i: int) -> int:
        return max(0, (i - 1) * BATCH_SECONDS)
    return sum(keys_per_batch for i in range(fed) if wm(i) + ttl_s > watermark_s)


def watermark_s(progress: dict) -> int:
    text = progress.get("eventTime", {}).get("watermark", "1970-01-01T00:00:00.000Z")
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def run(spark: SparkSession, name: str, conf: dict[str, str], data: Path, work: Path,
        batches: int, keys_per_batch: int, ttl_s: int) -> Result:
    for key in TTL_KEYS:
        spark.conf.unset(PREFIX + key)
    settings = dict(conf)
    if name not in ("no-ttl", "warmup"):
        settings |= {"ttl.duration": f"{ttl_s}s", "ttl.timeCharacteristic": "EventTime"}
    for key, value in settings.items():
        spark.conf.set(PREFIX + key, value)
    inputs, checkpoint = work / name / "in", work / name / "ck"
    inputs.mkdir(parents=True)
    stream = (
        spark.readStream.schema("key long, t long").option("maxFilesPerTrigger", 1)
        .parquet(str(inputs))
    )
    counts = (
        stream.withColumn("ts", F.timestamp_seconds("t")).withWatermark("ts", "0 seconds")
        .groupBy("key").agg(F.count("*").alias("n"))
    )
    query = (
        counts.writeStream.format("noop").outputMode("update")
        .option("checkpointLocation", str(checkpoint)).start()
    )
    result = Result(name, removed=dict.fromkeys(METRICS, 0))
    rows, seconds = 0, 0.0
    warmup = ttl_s // BATCH_SECONDS + 1
    last_batch = -1
    try:
        for b in range(batches):
            for part in (data / f"batch-{b:04d}").glob("*.parquet"):
                shutil.copy(part, inputs / f"{b:04d}-{part.name}")
            query.processAllAvailable()
            # The input batch, and any no-data batch Spark ran after it as the watermark moved.
            new = [p for p in query.recentProgress if p["batchId"] > last_batch]
            last_batch = new[-1]["batchId"]
            for progress in new:
                rows += progress["numInputRows"]
                seconds += progress["durationMs"]["triggerExecution"] / 1000
                for metric in METRICS:
                    result.removed[metric] += progress["stateOperators"][0]["customMetrics"].get(
                        metric, 0)
            stored = new[-1]["stateOperators"][0]["numRowsTotal"]
            live = live_keys(b + 1, watermark_s(new[-1]), keys_per_batch, ttl_s)
            if b >= warmup and live:
                result.ratios.append(stored / live)
            result.stored_end, result.live_end = stored, live
    finally:
        query.stop()
    result.rows_per_s = rows / seconds
    return result


def report(results: list[Result]) -> str:
    base = next((r for r in results if r.name == "no-ttl"), None)
    lines = [
        "| run | rows/s | x no-ttl | stored/live mean | max | end (stored / live) | removed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r.rows_per_s / base.rows_per_s:.2f}" if base else "n/a"
        removed = ", ".join(f"{k}={v:,}" for k, v in r.removed.items() if v) or "-"
        mean = statistics.mean(r.ratios) if r.ratios else float("nan")
        worst = max(r.ratios) if r.ratios else float("nan")
        lines.append(
            f"| {r.name} | {r.rows_per_s:,.0f} | {ratio} | {mean:.2f} | {worst:.2f} "
            f"| {r.stored_end:,} / {r.live_end:,} | {removed} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--keys-per-batch", type=int, default=20_000)
    parser.add_argument("--ttl-batches", type=int, default=10,
                        help="the TTL, in batches of event time (10 s each)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--incremental-factor", type=int, default=4,
                        help="incremental cleanup checks this many times the churn per commit")
    parser.add_argument("--min-deltas", type=int, default=10,
                        help="spark.sql.streaming.stateStore.minDeltasForSnapshot (snapshot "
                             "commits run full-snapshot and compaction cleanup)")
    parser.add_argument("--maintenance-interval", default="2s",
                        help="the state store maintenance interval (background cleanup)")
    parser.add_argument("--warmup-batches", type=int, default=10,
                        help="batches of a discarded run first (JIT, caches)")
    parser.add_argument("--runs", default="no-ttl,fullSnapshot,incremental,compaction,background")
    parser.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "keyedstate-ttl-bench"))
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()
    if args.batches < 2 * (args.ttl_batches + 1):
        parser.error("--batches must cover at least two TTL windows")

    spark = keyedstate.configure(
        SparkSession.builder.master("local[2]").appName("ttl-bench")
        .config("spark.driver.memory", "4g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.sql.streaming.stateStore.maintenanceInterval", args.maintenance_interval)
        .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", str(args.min_deltas))
        # Measure the provider's own snapshot cadence only: snapshots Spark forces when it sees
        # uploads lag would also run full-snapshot and compaction cleanup.
        .config("spark.sql.streaming.stateStore.forceSnapshotUploadOnLag", "false")
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    data = Path(args.data) / f"b{args.batches}-k{args.keys_per_batch}"
    generate(spark, data, args.batches, args.keys_per_batch)
    work = Path(tempfile.mkdtemp(prefix="keyedstate-ttl-bench-"))
    ttl_s = args.ttl_batches * BATCH_SECONDS
    confs = strategies(args.keys_per_batch, args.partitions, args.incremental_factor)
    results = []
    try:
        if args.warmup_batches:
            print("[warmup] ...", flush=True)
            run(spark, "warmup", {}, data, work, args.warmup_batches, args.keys_per_batch, ttl_s)
        for name in args.runs.split(","):
            print(f"[churn] {name} ...", flush=True)
            results.append(run(spark, name, confs[name], data, work, args.batches,
                               args.keys_per_batch, ttl_s))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nbatches={args.batches} keys/batch={args.keys_per_batch:,} "
          f"ttl={args.ttl_batches} batches ({ttl_s} s event time) partitions={args.partitions} "
          f"minDeltasForSnapshot={args.min_deltas} "
          f"incremental size={confs['incremental'].get('ttl.cleanup.incremental.size')}\n")
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
