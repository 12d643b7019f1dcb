"""Checkpoint storage benchmark: keyedstate against Spark's RocksDB provider with the checkpoint
on the local file system, on HDFS and on S3, side by side in one process.

One run starts the test servers (tests/support/servers/: Hadoop's MiniDFSCluster with 3 datanodes,
and moto's S3 server reached through s3a), then for each storage and provider runs the same
streaming aggregation (count and sum per key, update mode, ``local[2]``, 4 state partitions, parquet
input read one file per micro-batch from the local disk; only the checkpoint is on the storage): a
first batch puts every key in state, then ``--batches`` batches update ``--updates`` random keys
each. Reported per storage and provider, over the update batches:

* batch duration p50/p90 (``durationMs.triggerExecution``) and commit duration p50/p90 (the
  aggregation's ``commitTimeMs``, summed over its partitions), with the providers' own commit
  timings (``customMetrics``) and Spark's offset and commit log writes (``walCommit`` and
  ``commitOffsets``, which go to the same storage for every provider);
* bytes of new or changed files under the checkpoint's ``state/`` folder per batch (listed
  through Hadoop's ``FileSystem`` after each batch; background uploads land in the batch during
  which they finish);
* the ratio keyedstate / Spark's provider on the same storage, and the load average.

Every batch's output (a digest of its rows) must be equal across all runs, and the last batch's
must equal the same counts computed by a batch query over the input files; otherwise the bench
exits with status 1, so a wrong result cannot look fast.

    python bench/storage_bench.py                                  # the documented run
    python bench/storage_bench.py --keys 50000 --updates 5000 --batches 5   # quick
    python bench/storage_bench.py --storages s3 --providers keyedstate,rocksdb-changelog,rocksdb
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.support
from bench_support import load_average, median, session  # noqa: E402
from checkpoint_bench import PROVIDERS, file_kind, use_provider  # noqa: E402
from pyspark.sql import Column, DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from tests.support.servers.hdfs_cluster import HdfsCluster  # noqa: E402
from tests.support.servers.s3_endpoint import S3Endpoint, s3a_jars  # noqa: E402

STORAGES = ("local", "hdfs", "s3")
REFERENCE = "keyedstate"
# Spark's log writes on the checkpoint's storage, per batch (the same for every provider).
SPARK_LOG_PHASES = ("walCommit", "commitOffsets")


@dataclass
class Storage:
    name: str
    root: str  # URI under which each run gets its checkpoint
    hadoop: dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    storage: str
    provider: str
    load_start: str = ""
    load_end: str = ""
    error: str = ""
    initial_ms: float = 0.0
    initial_bytes: int = 0
    batch_ms: list[float] = field(default_factory=list)
    commit_ms: list[float] = field(default_factory=list)
    log_ms: list[float] = field(default_factory=list)  # walCommit + commitOffsets
    bytes_per_batch: list[int] = field(default_factory=list)
    bytes_after: int = 0  # landed between the last batch and the query's stop
    bytes_by_kind: dict[str, int] = field(default_factory=dict)  # over the update batches
    metrics: list[dict[str, int]] = field(default_factory=list)  # customMetrics per batch
    digests: dict[int, list[int]] = field(default_factory=dict)


def p90(values: list[float]) -> float:
    """Nearest rank: the 9th of 10 values."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)] if ordered else float("nan")


def digest_columns() -> list[Column]:
    """Rows, sum of n and an order-independent hash of an output's rows (key, n, total)."""
    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum("n").alias("n"),
        F.sum(F.hash("key", "n", "total").cast("long")).alias("hash"),
    ]


def as_digest(frame: DataFrame) -> list[int]:
    row = frame.select(*digest_columns()).collect()[0]
    return [int(row["rows"]), int(row["n"] or 0), int(row["hash"] or 0)]


# -- input ----------------------------------------------------------------------------------------


def generate(spark: SparkSession, folder: Path, keys: int, updates: int, batches: int) -> None:
    """Parquet inputs, one file each: every key once, then ``batches`` files of ``updates``
    random keys; ``v`` is a random 1..100."""

    def write(frame: DataFrame, name: str) -> None:
        frame.coalesce(1).write.parquet(str(folder / name))

    value = (F.rand(seed=7) * 100).cast("int") + 1
    write(spark.range(keys).select(F.col("id").alias("key"), value.alias("v")), "initial")
    for b in range(batches):
        key = (F.rand(seed=1000 + b) * keys).cast("long").alias("key")
        v = ((F.rand(seed=2000 + b) * 100).cast("int") + 1).alias("v")
        write(spark.range(updates).select(key, v), f"update-{b:03d}")


def expected_last(spark: SparkSession, data: Path, batches: int) -> list[int]:
    """The last batch's output computed as a batch query: count and sum per key over every
    input file, for the keys of the last file."""
    names = ["initial"] + [f"update-{b:03d}" for b in range(batches)]
    everything = spark.read.parquet(*[str(data / n) for n in names])
    totals = everything.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    last_keys = spark.read.parquet(str(data / names[-1])).select("key").distinct()
    return as_digest(totals.join(last_keys, "key"))


def feed(data: Path, name: str, inputs: Path) -> None:
    for part in (data / name).glob("*.parquet"):
        shutil.copy(part, inputs / f"{name}-{part.name}")


# -- the checkpoint's files, on any storage --------------------------------------------------------


def state_files(spark: SparkSession, checkpoint: str) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file under ``<checkpoint>/state`` (Hadoop's ``.crc``
    side files and in-flight temporary files left out), through the JVM's Hadoop file system."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/state")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    if not fs.exists(path):
        return {}
    files: dict[str, tuple[int, int]] = {}
    listing = fs.listFiles(path, True)
    while listing.hasNext():
        status = listing.next()
        name = status.getPath().getName()
        if name.endswith(".crc") or (name.startswith(".") and name.endswith(".tmp")):
            continue
        files[status.getPath().toString()] = (status.getLen(), status.getModificationTime())
    return files


def written_since(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> int:
    return sum(size for path, (size, mtime) in after.items() if before.get(path) != (size, mtime))


def count_by_kind(
    into: dict[str, int], before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> None:
    for path, (size, mtime) in after.items():
        if before.get(path) != (size, mtime):
            into[file_kind(path)] = into.get(file_kind(path), 0) + size


# -- one run ---------------------------------------------------------------------------------------


def progress_of(query: Any, batch_id: int) -> dict[str, Any]:
    """The progress of ``batch_id`` (a batch that read input, not an idle trigger)."""
    deadline = time.monotonic() + 30
    while True:
        for progress in reversed(query.recentProgress):
            if progress["batchId"] == batch_id and progress["numInputRows"] > 0:
                return dict(progress)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no progress reported for batch {batch_id}")
        time.sleep(0.05)


def run_one(
    spark: SparkSession, storage: Storage, provider: str, data: Path, work: Path, batches: int,
    tag: str,
) -> Run:
    run = Run(storage.name, provider, load_start=load_average())
    use_provider(spark, provider)
    inputs = work / f"{tag}-{storage.name}-{provider}" / "in"
    inputs.mkdir(parents=True)
    checkpoint = f"{storage.root.rstrip('/')}/{tag}-{provider}"

    def sink(frame: DataFrame, batch_id: int) -> None:
        run.digests[batch_id] = as_digest(frame)

    query = (
        spark.readStream.schema("key long, v int").option("maxFilesPerTrigger", 1)
        .parquet(str(inputs))
        .groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .writeStream.outputMode("update").option("checkpointLocation", checkpoint)
        .foreachBatch(sink).start()
    )
    try:
        feed(data, "initial", inputs)
        query.processAllAvailable()
        run.initial_ms = progress_of(query, 0)["durationMs"]["triggerExecution"]
        before = state_files(spark, checkpoint)
        run.initial_bytes = written_since({}, before)
        for b in range(batches):
            feed(data, f"update-{b:03d}", inputs)
            query.processAllAvailable()
            after = state_files(spark, checkpoint)
            run.bytes_per_batch.append(written_since(before, after))
            count_by_kind(run.bytes_by_kind, before, after)
            before = after
            progress = progress_of(query, b + 1)
            durations = progress["durationMs"]
            run.batch_ms.append(durations["triggerExecution"])
            run.log_ms.append(sum(durations.get(phase, 0) for phase in SPARK_LOG_PHASES))
            operator = progress["stateOperators"][0]
            run.commit_ms.append(operator["commitTimeMs"])
            run.metrics.append(dict(operator.get("customMetrics", {})))
    finally:
        query.stop()
    run.bytes_after = written_since(before, state_files(spark, checkpoint))
    run.load_end = load_average()
    return run


def attempt(run: Callable[[], Run], storage: str, provider: str) -> Run:
    """A run that fails is reported with its error (first lines) instead of ending the bench."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - reported in the table, and the exit status
        first = " ".join(str(e).split())[:400]
        print(f"  FAILED: {first}", flush=True)
        return Run(storage, provider, error=first, load_end=load_average())


# -- report ----------------------------------------------------------------------------------------


def timing_metrics(run: Run) -> dict[str, float]:
    """Median per batch of each timing metric the provider reports (summed over partitions)."""
    names = sorted({
        name for batch in run.metrics for name, value in batch.items()
        if (name.endswith(("Ms", "Latency")) or "Latency" in name) and value
    })
    return {name: median([float(batch.get(name, 0)) for batch in run.metrics]) for name in names}


def report(runs: list[Run]) -> str:
    lines = [
        "| storage | provider | load start / end | initial batch ms | batch p50 ms | batch p90 ms "
        "| commit p50 ms | commit p90 ms | Spark logs p50 ms | bytes/batch | after last batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        start, end = (x.removeprefix("load average ") for x in (r.load_start, r.load_end))
        load = f"{start} / {end}"
        if r.error:
            lines.append(f"| {r.storage} | {r.provider} | {load} | failed: {r.error[:160]} "
                         "| | | | | | | |")
            continue
        lines.append(
            f"| {r.storage} | {r.provider} | {load} | {r.initial_ms:,.0f} "
            f"| {median(r.batch_ms):,.0f} | {p90(r.batch_ms):,.0f} "
            f"| {median(r.commit_ms):,.0f} | {p90(r.commit_ms):,.0f} | {median(r.log_ms):,.0f} "
            f"| {sum(r.bytes_per_batch) / len(r.bytes_per_batch):,.0f} | {r.bytes_after:,} |"
        )
    return "\n".join(lines)


def ratios(runs: list[Run]) -> str:
    lines = [
        "| storage | keyedstate / | batch p50 | batch p90 | commit p50 | commit p90 | bytes/batch "
        "| initial batch |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def x(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "n/a"

    for ours in (r for r in runs if r.provider == REFERENCE and not r.error):
        for other in runs:
            if other.storage != ours.storage or other.provider == REFERENCE or other.error:
                continue
            lines.append(
                f"| {ours.storage} | {other.provider} "
                f"| {x(median(ours.batch_ms), median(other.batch_ms))} "
                f"| {x(p90(ours.batch_ms), p90(other.batch_ms))} "
                f"| {x(median(ours.commit_ms), median(other.commit_ms))} "
                f"| {x(p90(ours.commit_ms), p90(other.commit_ms))} "
                f"| {x(sum(ours.bytes_per_batch), sum(other.bytes_per_batch))} "
                f"| {x(ours.initial_ms, other.initial_ms)} |"
            )
    return "\n".join(lines)


def breakdown(runs: list[Run]) -> str:
    lines = []
    for r in runs:
        if r.error:
            continue
        parts = ", ".join(f"{name} {value:,.0f}" for name, value in timing_metrics(r).items())
        lines.append(f"- {r.storage} / {r.provider}: {parts or 'none'}")
    return "\n".join(lines)


def bytes_breakdown(runs: list[Run]) -> str:
    kinds = sorted({kind for r in runs for kind in r.bytes_by_kind})
    lines = [
        "| storage | provider | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for r in runs:
        if r.error:
            continue
        n = max(1, len(r.bytes_per_batch))
        cells = " | ".join(f"{r.bytes_by_kind.get(kind, 0) / n:,.0f}" for kind in kinds)
        lines.append(f"| {r.storage} | {r.provider} | {cells} |")
    return "\n".join(lines)


def check_outputs(runs: list[Run], expected: list[int], last: int) -> list[str]:
    """Differences between the runs' outputs, batch by batch, and from the batch query."""
    done = [r for r in runs if not r.error]
    problems = []
    for r in done:
        if sorted(r.digests) != list(range(last + 1)):
            problems.append(f"{r.storage}/{r.provider}: batches {sorted(r.digests)}")
        if r.digests.get(last) != expected:
            problems.append(f"{r.storage}/{r.provider}: last batch {r.digests.get(last)} "
                            f"!= batch query {expected}")
    if done:
        first = done[0]
        for r in done[1:]:
            for batch, value in first.digests.items():
                if r.digests.get(batch) != value:
                    problems.append(f"{r.storage}/{r.provider} batch {batch}: "
                                    f"{r.digests.get(batch)} != {first.storage}/{first.provider} "
                                    f"{value}")
    return problems


# -- main ------------------------------------------------------------------------------------------


def start_storages(names: list[str], work: Path, datanodes: int) -> tuple[list[Storage], list[Any]]:
    storages, servers = [], []
    for name in names:
        if name == "local":
            storages.append(Storage("local", (work / "checkpoints").as_uri()))
        elif name == "hdfs":
            cluster = HdfsCluster(datanodes=datanodes)
            servers.append(cluster)
            began = time.perf_counter()
            cluster.start()
            print(f"HDFS minicluster ({datanodes} datanodes) at {cluster.namenode_uri} in "
                  f"{time.perf_counter() - began:.1f} s", flush=True)
            root = cluster.uri("/storage-bench")
            storages.append(Storage("hdfs", root, cluster.hadoop_settings()))
        elif name == "s3":
            endpoint = S3Endpoint()
            servers.append(endpoint)
            began = time.perf_counter()
            endpoint.start()
            print(f"S3 endpoint (moto) at {endpoint.endpoint_url} in "
                  f"{time.perf_counter() - began:.1f} s", flush=True)
            root = endpoint.uri("storage-bench")
            storages.append(Storage("s3", root, endpoint.hadoop_settings()))
        else:
            raise SystemExit(f"unknown storage {name!r}; known: {', '.join(STORAGES)}")
    return storages, servers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--updates", type=int, default=40_000, help="rows per update batch")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--storages", default=",".join(STORAGES))
    parser.add_argument("--providers", default="keyedstate,rocksdb-changelog",
                        help=f"of {', '.join(PROVIDERS)}")
    parser.add_argument("--datanodes", type=int, default=3)
    parser.add_argument("--warmup-keys", type=int, default=20_000,
                        help="each provider first runs untimed on a local checkpoint with this "
                        "many keys and 3 small batches (0: no warm-up)")
    parser.add_argument("--hadoop-conf", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra Hadoop setting for every storage (repeatable)")
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()
    providers = args.providers.split(",")
    for name in providers:
        if name not in PROVIDERS:
            raise SystemExit(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)}")

    began = time.perf_counter()
    print(f"start: {load_average()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="keyedstate-storage-bench-"))
    storages, servers = start_storages(args.storages.split(","), work, args.datanodes)
    hadoop = {k: v for s in storages for k, v in s.hadoop.items()}
    hadoop.update(dict(setting.split("=", 1) for setting in args.hadoop_conf))
    conf = {f"spark.hadoop.{k}": v for k, v in hadoop.items()}
    if any(s.name == "s3" for s in storages):
        conf["spark.jars"] = ",".join(str(jar) for jar in s3a_jars())
    conf["spark.sql.streaming.stateStore.maintenanceInterval"] = "10s"
    spark = session("keyedstate-storage-bench", args.partitions, memory="4g", conf=conf)
    runs: list[Run] = []
    try:
        data = work / "data"
        generate(spark, data, args.keys, args.updates, args.batches)
        expected = expected_last(spark, data, args.batches)
        if args.warmup_keys:
            warm = work / "warmup-data"
            generate(spark, warm, args.warmup_keys, max(1, args.warmup_keys // 10), 3)
            local = Storage("local", (work / "warmup-checkpoints").as_uri())
            for provider in providers:
                print(f"[warm-up] {provider} ...", flush=True)
                run_one(spark, local, provider, warm, work, 3, "warmup")
        for index, storage in enumerate(storages):
            # Alternate the order, so that neither provider always runs first on a storage.
            for provider in providers if index % 2 == 0 else providers[::-1]:
                print(f"[{storage.name}] {provider} ... ({load_average()})", flush=True)
                runs.append(attempt(
                    lambda s=storage, p=provider: run_one(
                        spark, s, p, data, work, args.batches, "run"
                    ),
                    storage.name, provider,
                ))
    finally:
        spark.stop()
        for server in servers:
            server.close()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nkeys={args.keys:,} updates/batch={args.updates:,} batches={args.batches} "
          f"partitions={args.partitions}; {time.perf_counter() - began:.0f} s in all; "
          f"end: {load_average()}\n")
    print(report(runs))
    print("\nratios, keyedstate / Spark's provider on the same storage:\n")
    print(ratios(runs))
    print("\ncommit timings the providers report (median per batch, ms, summed over partitions):\n")
    print(breakdown(runs))
    print("\nbytes per batch by kind of file:\n")
    print(bytes_breakdown(runs))
    problems = check_outputs(runs, expected, args.batches)
    failed = [r for r in runs if r.error]
    print(f"\noutput: last batch by batch query: rows={expected[0]:,} sum(n)={expected[1]:,} "
          f"hash={expected[2]}")
    if problems:
        print("OUTPUTS DIFFER:\n  " + "\n  ".join(problems))
    else:
        print(f"every batch's output equal across the {len(runs) - len(failed)} runs that "
              "finished, and the last batch's equal to the batch query")
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    return 1 if problems or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
