"""Checkpointing benchmark: keyedstate against Spark's own state store providers.

One command runs the same stateful aggregation (count and sum per key) under each provider,
side by side in one process, and reports absolute figures and ratios to keyedstate. Every
provider first runs ``--warmup-batches`` update batches untimed; then each runs ``--rounds``
times, the providers in the given order in the first round and reversed in the second, and its
figures cover all its rounds (the JIT keeps compiling for many batches on 2 cores: the provider
measured first would pay for the code the others made hot).

* throughput (input rows per second of batch time) while a steady share of a large key space
  is updated every batch;
* commit latency p50/p99 (Spark's ``commitTimeMs`` of the aggregation, summed over partitions);
* bytes written to the checkpoint's ``state/`` folder per batch (new or changed files, Hadoop's
  ``.crc`` side files left out), background snapshot uploads included in the batch they land in;
* restart: time from ``start()`` to the first completed batch of a query restarted with a large
  state (``--restart-keys``), the state loaded from the checkpoint by new provider instances:
  ``keyedstate`` on the same executor (its local cache serves the files: local recovery),
  ``keyedstate-new-executor`` with an empty local directory (every file downloaded, as on a new
  executor). Spark's RocksDB provider gives every provider instance a new temporary directory
  and copies every file from the checkpoint, so its figure is a new executor's either way.

    python bench/checkpoint_bench.py            # the documented run (docs/benchmarks.md)
    python bench/checkpoint_bench.py --keys 200000 --updates 20000 --restart-keys 500000  # quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import keyedstate  # noqa: E402

SPARK_STATE = "org.apache.spark.sql.execution.streaming.state."
PROVIDERS: dict[str, dict[str, str]] = {
    "hdfs": {"providerClass": SPARK_STATE + "HDFSBackedStateStoreProvider"},
    "rocksdb": {
        "providerClass": SPARK_STATE + "RocksDBStateStoreProvider",
        "rocksdb.changelogCheckpointing.enabled": "false",
    },
    "rocksdb-changelog": {
        "providerClass": SPARK_STATE + "RocksDBStateStoreProvider",
        "rocksdb.changelogCheckpointing.enabled": "true",
    },
    "keyedstate": {"providerClass": keyedstate.PROVIDER_CLASS},
    "keyedstate-snapshots": {
        "providerClass": keyedstate.PROVIDER_CLASS,
        "keyedstate.changelogCheckpointing": "false",
    },
    # Not in the default run: the SST codec's trade-off, side by side with the default (zstd).
    "keyedstate-lz4": {
        "providerClass": keyedstate.PROVIDER_CLASS,
        "keyedstate.compression": "lz4",
    },
}
DEFAULT_PROVIDERS = ["hdfs", "rocksdb", "rocksdb-changelog", "keyedstate", "keyedstate-snapshots"]
ALL_KEYS = sorted({k for conf in PROVIDERS.values() for k in conf})


@dataclass
class Result:
    provider: str
    rows: int = 0  # input rows of the measured batches, all rounds
    seconds: float = 0.0  # their batch time (triggerExecution)
    round_rates: list[float] = field(default_factory=list)  # rows/s of each round
    commit_ms: list[float] = field(default_factory=list)
    update_ms: list[float] = field(default_factory=list)  # allUpdatesTimeMs, summed over partitions
    batch_ms: list[float] = field(default_factory=list)  # triggerExecution
    bytes_per_batch: list[int] = field(default_factory=list)
    bytes_by_kind: list[dict[str, int]] = field(default_factory=list)  # per batch
    settled_bytes: int = 0  # written after the last batch, while the query idled (--settle-s)
    restart_s: float | None = None
    # keyedstate, per batch: flush ms summed over partitions / snapshots taken / flushes started
    commit_notes: list[str] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    def absorb(self, later: Result) -> None:
        """Adds a later round's measurements of the same provider."""
        self.rows += later.rows
        self.seconds += later.seconds
        self.round_rates += later.round_rates
        for name in ("commit_ms", "update_ms", "batch_ms", "bytes_per_batch", "bytes_by_kind",
                     "commit_notes"):
            getattr(self, name).extend(getattr(later, name))
        self.settled_bytes += later.settled_bytes

    def bytes_with_settled(self) -> float:
        """Bytes per batch counting what landed after the last batch too (--settle-s): Spark's
        snapshot uploads land in the run or after it depending on their timing."""
        n = max(1, len(self.bytes_per_batch))
        return (sum(self.bytes_per_batch) + self.settled_bytes) / n

    def p(self, q: float) -> float:
        data = sorted(self.commit_ms)
        return data[min(len(data) - 1, int(q * len(data)))] if data else float("nan")


def state_files(checkpoint: Path) -> dict[str, tuple[int, float]]:
    root = checkpoint / "state"
    if not root.exists():
        return {}
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime)
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(".crc")
    }


def written_since(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]) -> int:
    return sum(size for path, (size, mtime) in after.items() if before.get(path) != (size, mtime))


def file_kind(path: str) -> str:
    """What a state file is, for the bytes breakdown (keyedstate's and Spark's layouts)."""
    name = Path(path).name
    parent = Path(path).parent.name
    if parent == "changelog" or name.endswith(".changelog"):
        return "changelog"
    if name.endswith(".sst"):
        return "sst"
    if name.endswith(".zip") or parent == "private":
        return "rocksdb metadata"
    if name.endswith((".manifest", ".snapshot")):
        return "manifest/descriptor"
    return "other"


def written_by_kind(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]
) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for path, (size, mtime) in after.items():
        if before.get(path) != (size, mtime):
            kinds[file_kind(path)] = kinds.get(file_kind(path), 0) + size
    return kinds


def use_provider(spark: SparkSession, name: str) -> None:
    for key in ALL_KEYS:
        spark.conf.unset("spark.sql.streaming.stateStore." + key)
    for key, value in PROVIDERS[name].items():
        spark.conf.set("spark.sql.streaming.stateStore." + key, value)


def generate(spark: SparkSession, folder: Path, keys: int, updates: int, batches: int,
             restart_keys: int) -> None:
    """Parquet inputs: all keys once, then `batches` files of `updates` random keys."""
    if (folder / "done").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)

    def write(df: object, name: str) -> None:
        df.coalesce(1).write.parquet(str(folder / name))  # type: ignore[attr-defined]

    write(spark.range(keys).select(F.col("id").alias("key"), F.lit(1).alias("v")), "initial")
    for b in range(batches):
        updated = (F.rand(seed=b) * keys).cast("long").alias("key")
        write(spark.range(updates).select(updated, F.lit(1).alias("v")), f"update-{b:03d}")
    write(spark.range(restart_keys).select(F.col("id").alias("key"), F.lit(1).alias("v")), "big")
    write(spark.range(1000).select(F.col("id").alias("key"), F.lit(1).alias("v")), "after-restart")
    (folder / "done").touch()


def start(spark: SparkSession, inputs: Path, checkpoint: Path):  # noqa: ANN201
    schema = "key long, v int"
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    agg = stream.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    return (
        agg.writeStream.format("noop").outputMode("update")
        .option("checkpointLocation", str(checkpoint)).start()
    )


def feed(data: Path, name: str, inputs: Path) -> None:
    for part in (data / name).glob("*.parquet"):
        shutil.copy(part, inputs / f"{name}-{part.name}")


def new_phase(spark: SparkSession, name: str, work: Path, phase: str) -> tuple[Path, Path]:
    """Selects the provider; input and checkpoint folders of its own for this phase, removed
    only after the session stops (background maintenance of a stopped query may still write)."""
    use_provider(spark, name)
    inputs, checkpoint = work / f"{name}-{phase}" / "in", work / f"{name}-{phase}" / "ck"
    inputs.mkdir(parents=True)
    return inputs, checkpoint


def run_updates(spark: SparkSession, name: str, data: Path, work: Path, batches: int,
                settle_s: float = 0, phase: str = "updates") -> Result:
    inputs, checkpoint = new_phase(spark, name, work, phase)
    query = start(spark, inputs, checkpoint)
    feed(data, "initial", inputs)
    query.processAllAvailable()
    result = Result(name)
    before = state_files(checkpoint)
    for b in range(batches):
        feed(data, f"update-{b:03d}", inputs)
        query.processAllAvailable()
        progress = query.lastProgress
        after = state_files(checkpoint)
        result.bytes_per_batch.append(written_since(before, after))
        result.bytes_by_kind.append(written_by_kind(before, after))
        before = after
        result.rows += progress["numInputRows"]
        result.seconds += progress["durationMs"]["triggerExecution"] / 1000
        operator = progress["stateOperators"][0]
        result.commit_ms.append(operator["commitTimeMs"])
        result.update_ms.append(operator["allUpdatesTimeMs"])
        result.batch_ms.append(progress["durationMs"]["triggerExecution"])
        metrics = operator.get("customMetrics", {})
        if "keyedstateCommitFlushMs" in metrics:
            result.commit_notes.append(
                f"flush {metrics['keyedstateCommitFlushMs']}"
                f"/{metrics['keyedstateSnapshotsTaken']}s/{metrics['keyedstateBackgroundFlushes']}b"
            )
    if settle_s > 0:
        # Background snapshot uploads of these batches that have not landed yet (Spark's run in
        # its maintenance thread) land now, without a batch to attribute them to.
        time.sleep(settle_s)
        result.settled_bytes = written_since(before, state_files(checkpoint))
    query.stop()
    result.round_rates.append(result.rows_per_s)
    return result


NEW_EXECUTOR = "-new-executor"
LOCAL_DIR = "spark.sql.streaming.stateStore.keyedstate.localDir"


def run_restart(spark: SparkSession, name: str, data: Path, work: Path) -> tuple[float, str]:
    """The restart's seconds, and what keyedstate's load did (its metrics; "" for Spark's)."""
    provider = name.removesuffix(NEW_EXECUTOR)
    inputs, checkpoint = new_phase(spark, provider, work, "restart" + name[len(provider):])
    query = start(spark, inputs, checkpoint)
    feed(data, "big", inputs)
    query.processAllAvailable()
    query.stop()
    time.sleep(2)  # let maintenance threads settle
    if name.endswith(NEW_EXECUTOR):
        # Nothing local: the restarted query's provider instances open an empty local
        # directory, as on a new executor, and download every file of the checkpoint.
        empty = work / f"{name}-local"
        empty.mkdir()
        spark.conf.set(LOCAL_DIR, str(empty))
    feed(data, "after-restart", inputs)
    began = time.perf_counter()
    query = start(spark, inputs, checkpoint)
    query.processAllAvailable()
    elapsed = time.perf_counter() - began
    metrics = query.lastProgress["stateOperators"][0]["customMetrics"]
    query.stop()
    spark.conf.unset(LOCAL_DIR)
    load = ", ".join(
        f"{key.removeprefix('keyedstateLoad')} {metrics[key]:,}"
        for key in sorted(metrics)
        if key.startswith("keyedstateLoad")
    )
    return elapsed, load


def report(results: list[Result], reference: str = "keyedstate") -> str:
    # Ratios to keyedstate, or to the first provider of a run without it.
    ref = next((r for r in results if r.provider == reference), results[0])
    lines = [
        f"| provider | rows/s | x {ref.provider} | commit p50 ms | x | commit p99 ms | x "
        "| bytes/batch | x | with later uploads | x | restart s | x |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a and b and a == a and b == b else "n/a"  # a == a: not nan

    def ms(value: float) -> str:
        return "-" if value != value else f"{value:.0f}"  # nan: no update phase

    for r in results:
        mean_bytes = statistics.mean(r.bytes_per_batch) if r.bytes_per_batch else 0
        ref_bytes = statistics.mean(ref.bytes_per_batch)
        rate = f"{r.rows_per_s:,.0f}" if r.bytes_per_batch else "-"  # "-": restart only
        lines.append(
            f"| {r.provider} | {rate} | {ratio(r.rows_per_s, ref.rows_per_s)} "
            f"| {ms(r.p(0.5))} | {ratio(r.p(0.5), ref.p(0.5))} "
            f"| {ms(r.p(0.99))} | {ratio(r.p(0.99), ref.p(0.99))} "
            f"| {f'{mean_bytes:,.0f}' if r.bytes_per_batch else '-'} "
            f"| {ratio(mean_bytes, ref_bytes)} "
            f"| {f'{r.bytes_with_settled():,.0f}' if r.bytes_per_batch else '-'} "
            f"| {ratio(r.bytes_with_settled(), ref.bytes_with_settled())} "
            f"| {r.restart_s if r.restart_s is None else f'{r.restart_s:.1f}'} "
            f"| {ratio(r.restart_s, ref.restart_s)} |"
        )
    return "\n".join(lines)


def breakdown(results: list[Result]) -> str:
    """Bytes per batch by kind of file: where each provider's checkpoint bytes go."""
    kinds = sorted({k for r in results for batch in r.bytes_by_kind for k in batch})
    lines = ["| provider | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for r in results:
        n = max(1, len(r.bytes_by_kind))
        cells = " | ".join(
            f"{sum(batch.get(k, 0) for batch in r.bytes_by_kind) / n:,.0f}" for k in kinds
        )
        settled = (
            f" (+{r.settled_bytes:,} after the last batch: "
            f"{r.bytes_with_settled():,.0f} per batch with them)"
            if r.settled_bytes else ""
        )
        lines.append(f"| {r.provider} | {cells} |{settled}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=100_000, help="rows per update batch")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--restart-keys", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS),
                        help=f"of {', '.join(PROVIDERS)}")
    parser.add_argument("--restart-providers",
                        default="rocksdb,rocksdb-changelog,keyedstate,keyedstate" + NEW_EXECUTOR,
                        help="providers whose restart is measured; 'none' skips the restart part; "
                        "keyedstate-new-executor: keyedstate with nothing in its local cache")
    parser.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "keyedstate-bench"))
    parser.add_argument("--json", help="also write the raw figures here")
    parser.add_argument("--settle-s", type=float, default=0,
                        help="after the last batch, wait this long with the query running and "
                        "report the bytes that land meanwhile (background snapshot uploads)")
    parser.add_argument("--warmup-batches", type=int, default=20,
                        help="before the measured runs, every provider runs this many update "
                        "batches untimed (0: none): the JIT compiles what the runs before it "
                        "exercised, so the first provider measured would pay for the others")
    parser.add_argument("--rounds", type=int, default=2,
                        help="measured runs of every provider, the providers in the given order "
                        "in the first round, reversed in the second, and so on; each provider's "
                        "figures cover all its rounds, so none gains from its place in the order")
    parser.add_argument("--keyedstate-conf", action="append", default=[], metavar="NAME=VALUE",
                        help="a keyedstate option for the keyedstate providers (repeatable), "
                        "e.g. changelogCompression=lz4")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    for setting in args.keyedstate_conf:
        name, _, value = setting.partition("=")
        for provider, conf in PROVIDERS.items():
            if provider.startswith("keyedstate"):
                conf["keyedstate." + name] = value
    ALL_KEYS[:] = sorted({k for conf in PROVIDERS.values() for k in conf})

    spark = keyedstate.configure(
        SparkSession.builder.master("local[2]").appName("checkpoint-bench")
        .config("spark.driver.memory", "8g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "10s")
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    data = Path(args.data) / f"k{args.keys}-u{args.updates}-b{args.batches}-r{args.restart_keys}"
    generate(spark, data, args.keys, args.updates, args.batches, args.restart_keys)
    work = Path(tempfile.mkdtemp(prefix="keyedstate-bench-"))
    results = []
    try:
        for name in args.providers.split(",") if args.warmup_batches else ():
            print(f"[warm-up] {name} ...", flush=True)
            run_updates(spark, name, data, work, args.warmup_batches, phase="warmup")
        providers = args.providers.split(",")
        for round_ in range(args.rounds):
            for name in providers if round_ % 2 == 0 else providers[::-1]:
                print(f"[updates] {name}, round {round_ + 1} ...", flush=True)
                run = run_updates(spark, name, data, work, args.batches, args.settle_s,
                                  phase=f"updates{round_}")
                first = next((r for r in results if r.provider == name), None)
                if first is None:
                    results.append(run)
                else:
                    first.absorb(run)
        results.sort(key=lambda r: providers.index(r.provider))
        for name in args.restart_providers.split(","):
            if not name or name == "none":
                continue
            print(f"[restart] {name} ...", flush=True)
            seconds, load = run_restart(spark, name, data, work)
            if load:
                print(f"[restart] {name}: {seconds:.1f} s; the load (4 partitions): {load}",
                      flush=True)
            result = next((r for r in results if r.provider == name), None)
            if result is None:  # a restart-only row (keyedstate-new-executor)
                result = Result(name)
                results.append(result)
            result.restart_s = seconds
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nkeys={args.keys:,} updates/batch={args.updates:,} batches={args.batches} "
          f"rounds={args.rounds} restart keys={args.restart_keys:,} "
          f"partitions={args.partitions}\n")
    print(report(results))
    print("\nrows/s of each round (the first in --providers order, the next reversed):\n")
    for r in results:
        if r.round_rates:
            print(f"{r.provider}: " + ", ".join(f"{rate:,.0f}" for rate in r.round_rates))
    print("\ncommit ms per batch (keyedstate: flush ms / stores that took a snapshot (s) / "
          "stores that started a background flush (b)):\n")
    for r in results:
        if r.commit_ms:
            notes = r.commit_notes or [""] * len(r.commit_ms)
            cells = (
                f"{ms:.0f}" + (f" ({note})" if note else "")
                for ms, note in zip(r.commit_ms, notes, strict=True)
            )
            print(f"{r.provider}: " + ", ".join(cells))
    print("\nper batch, median (state updates and commits are summed over the partitions, "
          "which run 2 at a time):\n")
    for r in results:
        if r.batch_ms:
            median = {k: statistics.median(v) for k, v in
                      (("batch", r.batch_ms), ("updates", r.update_ms), ("commit", r.commit_ms))}
            print(f"{r.provider}: batch {median['batch']:.0f} ms, state updates "
                  f"{median['updates']:.0f} ms, commit {median['commit']:.0f} ms")
    print("\nbytes per batch by kind of file:\n")
    print(breakdown(results))
    if args.json:
        Path(args.json).write_text(
            json.dumps([{**r.__dict__, "rows_per_s": r.rows_per_s} for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
