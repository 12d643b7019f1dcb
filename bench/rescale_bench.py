"""Rescale benchmark: keyedstate.rescale against Spark's offline state repartition.

One command builds the state of the same streaming aggregation (count and sum per key, one input
row per key, ``--keys`` distinct keys, ``--from`` state partitions) once with keyedstate's provider
and once with Spark's RocksDB provider, then changes the partition count of each checkpoint step by
step (default 8 -> 12 -> 5), in one process, and reports seconds and ratios per step:

* ``spark``: ``spark._streamingCheckpointManager.repartition(checkpoint, n)`` (Spark 4.2+, only
  for Spark's RocksDB provider). It works in place: it appends a repartition batch to the
  checkpoint. It runs on a copy of the built checkpoint (the copy is not timed).
* ``keyedstate`` (new checkpoint): ``keyedstate.rescale(spark, checkpoint, n, output)``; each
  step reads the previous step's output and writes a new checkpoint.
* ``keyedstate`` (in place): ``keyedstate.rescale(spark, checkpoint, n, in_place=True)`` on a copy
  of the built checkpoint (the copy is not timed), the same kind of operation as Spark's.

Each step is timed around the call alone (wall clock, from the call to its return), after every
mode has run its steps once, untimed, on a 1,000-key state (class loading, JIT). Every result
is then checked, untimed: the ``statestore`` source reads the checkpoint's last batch and must
return one row per key, every row in partition ``pmod(hash(key), n)`` (the partition Spark's
hash partitioning sends the key to), the aggregates of the input (count 1 per key, sum of the
values), ``n`` distinct partitions, and the last offset log entry must pin
``spark.sql.shuffle.partitions`` to ``n``. At the end each final checkpoint is restarted for one
more batch (1,000 new and 1,000 existing keys), which must run with the new partition count and
end with ``--keys`` + 1,000 keys in state.

    python bench/rescale_bench.py                    # the documented run: 10,000,000 keys
    python bench/rescale_bench.py --keys 200000      # quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import keyedstate  # noqa: E402

PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
SCHEMA = "key long, v int"
EXTRA_KEYS = 1000  # the restart batch: this many new keys and this many existing ones

SPARK = "spark"
OURS = "keyedstate"
OURS_IN_PLACE = "keyedstate-in-place"
MODES = (SPARK, OURS, OURS_IN_PLACE)


@dataclass
class Step:
    mode: str
    from_partitions: int
    to_partitions: int
    seconds: float = float("nan")
    keys: int = 0
    reported_keys: int | None = None  # RescaleResult.keys
    written_bytes: int = 0  # new or changed files in the checkpoint (all files of a new one)
    detail: dict[str, object] = field(default_factory=dict)  # RescaleResult's other figures
    checked: str = "not checked"
    error: str | None = None


@dataclass
class Run:
    keys: int
    partitions: list[int]
    spark_changelog: bool
    build_s: dict[str, float] = field(default_factory=dict)
    state_bytes: dict[str, int] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    restart: dict[str, str] = field(default_factory=dict)

    def step(self, mode: str, to: int) -> Step | None:
        return next((s for s in self.steps if s.mode == mode and s.to_partitions == to), None)


class CheckFailed(AssertionError):
    pass


def generate(spark: SparkSession, folder: Path, keys: int) -> None:
    """Parquet input: each key once, ``v = key % 7 + 1``; and the restart batch."""
    if (folder / "done").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    files = max(1, min(16, keys // 1_000_000))
    value = (F.col("id") % 7 + 1).cast("int").alias("v")
    (spark.range(0, keys, numPartitions=files).select(F.col("id").alias("key"), value)
     .write.parquet(str(folder / "initial")))
    # EXTRA_KEYS existing keys spread over the key space, and EXTRA_KEYS new ones
    existing = (F.col("id") * (keys // EXTRA_KEYS)).alias("key")
    new = (F.col("id") + keys).alias("key")
    extra = spark.range(EXTRA_KEYS).select(existing, F.lit(1).alias("v")).union(
        spark.range(EXTRA_KEYS).select(new, F.lit(1).alias("v")))
    extra.coalesce(1).write.parquet(str(folder / "extra"))
    (folder / "done").touch()


def expected_total(keys: int) -> int:
    """Sum of ``key % 7 + 1`` over ``range(keys)``."""
    full, rest = divmod(keys, 7)
    return full * 28 + rest * (rest + 1) // 2


def link_files(source: Path, target: Path, prefix: str) -> None:
    """Puts the parquet files of ``source`` into the input folder (hard links where possible)."""
    for part in sorted(source.glob("*.parquet")):
        dest = target / f"{prefix}-{part.name}"
        try:
            os.link(part, dest)
        except OSError:
            shutil.copy(part, dest)


def set_provider(spark: SparkSession, provider: str, changelog: bool) -> None:
    spark.conf.set(PROVIDER_KEY, provider)
    spark.conf.set(CHANGELOG_KEY, str(changelog).lower())


def start(spark: SparkSession, inputs: Path, checkpoint: Path):  # noqa: ANN201
    stream = spark.readStream.schema(SCHEMA).parquet(str(inputs))
    agg = stream.groupBy("key").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    return (
        agg.writeStream.format("noop").outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True).start()
    )


def build(spark: SparkSession, provider: str, inputs: Path, checkpoint: Path, keys: int,
          partitions: int) -> float:
    """Runs the aggregation over all input to completion (availableNow) and stops."""
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    began = time.perf_counter()
    query = start(spark, inputs, checkpoint)
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    if query.exception() is not None:
        raise RuntimeError(f"building the {provider} state failed: {query.exception()}")
    state = query.lastProgress["stateOperators"][0]
    if state["numRowsTotal"] != keys or state["numShufflePartitions"] != partitions:
        raise CheckFailed(f"built state has {state['numRowsTotal']} keys on "
                          f"{state['numShufflePartitions']} partitions")
    return elapsed


def dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*")
               if p.is_file() and not p.name.endswith(".crc"))


def files(checkpoint: Path) -> dict[str, tuple[int, float]]:
    """Size and modification time of each file of a checkpoint (Hadoop's .crc files left out)."""
    return {str(p.relative_to(checkpoint)): (p.stat().st_size, p.stat().st_mtime)
            for p in checkpoint.rglob("*") if p.is_file() and not p.name.endswith(".crc")}


def written_since(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]) -> int:
    return sum(size for path, (size, mtime) in after.items() if before.get(path) != (size, mtime))


def copy_checkpoint(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True)


def last_offset_conf(checkpoint: Path) -> dict[str, str]:
    offsets = checkpoint / "offsets"
    last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    if not (checkpoint / "commits" / str(last)).exists():
        raise CheckFailed(f"offset log entry {last} has no commit log entry")
    return json.loads((offsets / str(last)).read_text().splitlines()[1])["conf"]


def verify(spark: SparkSession, checkpoint: Path, partitions: int, keys: int) -> str:
    """Reads the rescaled state back; raises CheckFailed unless it is the built state, every key
    in the partition Spark's hash partitioning gives it."""
    pinned = last_offset_conf(checkpoint).get("spark.sql.shuffle.partitions")
    if pinned != str(partitions):
        raise CheckFailed(f"last offset log entry pins spark.sql.shuffle.partitions={pinned}")
    state = spark.read.format("statestore").load(str(checkpoint))
    count_field, sum_field = (f.name for f in state.schema["value"].dataType.fields)
    key_field = state.schema["key"].dataType.fields[0].name
    expected = F.expr(f"pmod(hash(key.`{key_field}`), {partitions})")
    row = state.agg(
        F.count("*").alias("rows"),
        F.sum(F.when(F.col("partition_id") != expected, 1).otherwise(0)).alias("misplaced"),
        F.countDistinct("partition_id").alias("partitions"),
        F.countDistinct(f"key.`{key_field}`").alias("distinct"),
        F.sum(f"value.`{count_field}`").alias("count"),
        F.sum(f"value.`{sum_field}`").alias("total"),
    ).collect()[0]
    want = {"rows": keys, "misplaced": 0, "partitions": min(partitions, keys), "distinct": keys,
            "count": keys, "total": expected_total(keys)}
    got = row.asDict()
    if got != want:
        raise CheckFailed(f"state read back {got}, expected {want}")
    return f"{keys:,} keys, all in pmod(hash(key), {partitions})"


def restart(spark: SparkSession, provider: str, inputs: Path, checkpoint: Path, keys: int,
            partitions: int, session_partitions: int) -> str:
    """One more batch on the rescaled checkpoint (the extra file is already in ``inputs``);
    the session's shuffle partitions stay at ``session_partitions`` on purpose: the checkpoint's
    pinned value must win."""
    spark.conf.set(PROVIDER_KEY, provider)
    spark.conf.set("spark.sql.shuffle.partitions", str(session_partitions))
    query = start(spark, inputs, checkpoint)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    state = query.lastProgress["stateOperators"][0]
    got = (state["numShufflePartitions"], state["numRowsTotal"], query.lastProgress["numInputRows"])
    want = (partitions, keys + EXTRA_KEYS, 2 * EXTRA_KEYS)
    if got != want:
        raise CheckFailed(f"restart batch (partitions, keys, input rows) = {got}, expected {want}")
    return f"ok: batch {query.lastProgress['batchId']} on {partitions} partitions, " \
           f"{keys + EXTRA_KEYS:,} keys"


def checked(step: Step, check) -> None:  # noqa: ANN001
    try:
        step.checked = check()
    except CheckFailed as e:
        step.checked = f"WRONG: {e}"
        step.error = step.error or step.checked
    except Exception as e:  # noqa: BLE001
        step.checked = f"check failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        step.error = step.error or step.checked
    print(f"    {step.mode} {step.from_partitions}->{step.to_partitions}: "
          f"{step.seconds:.1f} s; {step.checked}", flush=True)


def rescale_step(spark: SparkSession, step: Step, checkpoint: Path, work: Path,
                 check: bool, quiet: bool = False) -> Path:
    """Times one rescale of ``checkpoint``, checks the result; returns the rescaled checkpoint."""
    to = step.to_partitions
    before = {} if step.mode == OURS else files(checkpoint)
    began = time.perf_counter()
    try:
        if step.mode == SPARK:
            spark._streamingCheckpointManager.repartition(str(checkpoint), to)
            result = None
        elif step.mode == OURS:
            output = work / f"keyedstate-{to}"
            result = keyedstate.rescale(spark, str(checkpoint), to, str(output))
            checkpoint = output
        else:
            result = keyedstate.rescale(spark, str(checkpoint), to, in_place=True)
    except Exception as e:  # noqa: BLE001 - a failed competitor is reported, not fatal
        java = getattr(e, "java_exception", None)
        step.error = (java.toString() if java is not None else f"{type(e).__name__}: {e}")[:400]
        print(f"    {step.mode} {step.from_partitions}->{to} FAILED: {step.error}", flush=True)
        return checkpoint
    step.seconds = time.perf_counter() - began
    step.written_bytes = written_since(before, files(checkpoint))
    if result is not None:
        step.reported_keys = result.keys
        step.detail = {k: v for k, v in asdict(result).items()
                       if k in ("batch_id", "state_version", "bytes_written", "split_ms",
                                "build_ms", "total_ms", "resumed")}
        if result.keys != step.keys:
            step.error = f"RescaleResult.keys is {result.keys:,}, the state has {step.keys:,}"
    if check:
        checked(step, partial(verify, spark, checkpoint, to, step.keys))
    elif not quiet:
        print(f"    {step.mode} {step.from_partitions}->{to}: {step.seconds:.1f} s", flush=True)
    return checkpoint


def warm_up(spark: SparkSession, work: Path, modes: list[str], partitions: list[int],
            changelog: bool) -> None:
    """Runs every mode's steps once, untimed, on a 1,000-key state, so that no timed step pays
    for class loading and JIT compilation."""
    inputs = work / "in"
    inputs.mkdir(parents=True)
    (spark.range(1000).select(F.col("id").alias("key"), F.lit(1).alias("v")).coalesce(1)
     .write.mode("append").parquet(str(inputs)))
    for name, provider in ((SPARK, ROCKSDB), (OURS, keyedstate.PROVIDER_CLASS)):
        if not any(m.startswith(name) for m in modes):
            continue
        set_provider(spark, provider, changelog)
        build(spark, name, inputs, work / name, 1000, partitions[0])
        for mode in modes:
            if mode.startswith(name):
                checkpoint = work / mode
                if checkpoint != work / name:
                    copy_checkpoint(work / name, checkpoint)
                for a, b in zip(partitions, partitions[1:], strict=False):
                    step = Step(mode, a, b, keys=1000)
                    checkpoint = rescale_step(spark, step, checkpoint, work, check=False,
                                              quiet=True)
                    if step.error:
                        raise RuntimeError(f"warm-up {mode} {a}->{b} failed: {step.error}")


def fmt_s(step: Step | None) -> str:
    if step is None:
        return "n/a"
    if step.error and step.seconds != step.seconds:
        return "failed"
    return f"{step.seconds:.1f}" + ("" if not step.error else " (wrong)")


def ratio(spark_step: Step | None, ours: Step | None) -> str:
    if spark_step is None or ours is None or spark_step.error or ours.error:
        return "n/a"
    return f"**{spark_step.seconds / ours.seconds:.1f}x**"


def report(run: Run) -> str:
    lines = [
        "| step | keys | Spark repartition s | keyedstate s (new checkpoint) | Spark / keyedstate "
        "| keyedstate s (in place) | Spark / keyedstate in place |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    totals = {mode: 0.0 for mode in MODES}
    complete = {mode: True for mode in MODES}
    for a, b in zip(run.partitions, run.partitions[1:], strict=False):
        s, o, i = (run.step(mode, b) for mode in MODES)
        for mode, st in zip(MODES, (s, o, i), strict=True):
            if st is None or st.error:
                complete[mode] = False
            else:
                totals[mode] += st.seconds
        lines.append(f"| {a} -> {b} | {run.keys:,} | {fmt_s(s)} | {fmt_s(o)} | {ratio(s, o)} "
                     f"| {fmt_s(i)} | {ratio(s, i)} |")

    def overall(mode: str) -> str:
        if not (complete[SPARK] and complete[mode]) or not totals[mode]:
            return "n/a"
        return f"**{totals[SPARK] / totals[mode]:.1f}x**"

    def total(mode: str) -> str:
        return f"{totals[mode]:.1f}" if complete[mode] else "n/a"

    lines.append(f"| all steps | {run.keys:,} | {total(SPARK)} | {total(OURS)} | {overall(OURS)} "
                 f"| {total(OURS_IN_PLACE)} | {overall(OURS_IN_PLACE)} |")
    lines += ["", "MiB written to the checkpoint per step (new or changed files; all files of "
              "a new checkpoint):", "", "| step | " + " | ".join(MODES) + " |",
              "|---|" + "---:|" * len(MODES)]
    for a, b in zip(run.partitions, run.partitions[1:], strict=False):
        cells = [run.step(mode, b) for mode in MODES]
        lines.append(f"| {a} -> {b} | " + " | ".join(
            "n/a" if st is None or st.error else f"{st.written_bytes / 2**20:,.1f}"
            for st in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--from", dest="start", type=int, default=8,
                        help="state partitions of the built checkpoints")
    parser.add_argument("--to", default="12,5", help="partition counts of the steps, in order")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"which of {','.join(MODES)} to run")
    parser.add_argument("--spark-changelog", action="store_true",
                        help="build Spark's checkpoint with RocksDB changelog checkpointing on")
    parser.add_argument("--no-verify", action="store_true", help="skip reading the state back")
    parser.add_argument("--no-restart", action="store_true", help="skip the restart batch")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "keyedstate-bench"))
    parser.add_argument("--work", help="scratch folder, kept (default: a new temporary folder, "
                        "removed at the end)")
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}")
    partitions = [args.start] + [int(n) for n in args.to.split(",")]
    if (OURS in modes or OURS_IN_PLACE in modes) and not hasattr(keyedstate, "rescale"):
        print("keyedstate.rescale is not in this build of the package: keyedstate not timed",
              flush=True)
        modes = [m for m in modes if m == SPARK]

    spark = keyedstate.configure(
        SparkSession.builder.master("local[2]").appName("rescale-bench")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.start))
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    data = Path(args.data) / f"rescale-k{args.keys}"
    print(f"[data] {data}", flush=True)
    generate(spark, data, args.keys)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="keyedstate-rescale-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        parser.error(f"--work {work} is not empty")
    run = Run(args.keys, partitions, args.spark_changelog)
    # every checkpoint reads the same input folder, so the restart batch is one more file there
    inputs = work / "in"
    inputs.mkdir()
    link_files(data / "initial", inputs, "initial")
    built = {SPARK: work / "spark-built", OURS: work / "keyedstate-built"}
    provider = {SPARK: ROCKSDB, OURS: keyedstate.PROVIDER_CLASS,
                OURS_IN_PLACE: keyedstate.PROVIDER_CLASS}
    try:
        print("[warm-up] every mode's steps on 1,000 keys, untimed ...", flush=True)
        warm_up(spark, work / "warm-up", modes, partitions, args.spark_changelog)
        for name in [SPARK, OURS]:
            if not any(provider[m] == provider[name] for m in modes):
                continue
            print(f"[build] {name} ({provider[name].rsplit('.', 1)[-1]}, "
                  f"{args.keys:,} keys, {args.start} partitions) ...", flush=True)
            set_provider(spark, provider[name], args.spark_changelog)
            run.build_s[name] = build(spark, name, inputs, built[name], args.keys, args.start)
            run.state_bytes[name] = dir_bytes(built[name] / "state")
            print(f"    {run.build_s[name]:.1f} s, state/ {run.state_bytes[name] / 2**20:,.0f} MiB",
                  flush=True)
        # the checkpoints the steps work on; copies are not timed
        current = {
            SPARK: work / "spark",
            OURS: built[OURS],
            OURS_IN_PLACE: work / "keyedstate-in-place",
        }
        if SPARK in modes:
            copy_checkpoint(built[SPARK], current[SPARK])
        if OURS_IN_PLACE in modes:
            copy_checkpoint(built[OURS], current[OURS_IN_PLACE])
        time.sleep(2)  # let the stopped queries' maintenance threads settle
        for a, b in zip(partitions, partitions[1:], strict=False):
            print(f"[rescale] {a} -> {b}", flush=True)
            for mode in modes:
                if any(s.error for s in run.steps if s.mode == mode):
                    continue  # a failed step leaves nothing to rescale further
                step = Step(mode, a, b, keys=args.keys)
                run.steps.append(step)
                current[mode] = rescale_step(spark, step, current[mode], work, not args.no_verify)
        if not args.no_restart:
            link_files(data / "extra", inputs, "extra")
            for mode in modes:
                if any(s.error for s in run.steps if s.mode == mode):
                    continue
                print(f"[restart] {mode} ...", flush=True)
                try:
                    run.restart[mode] = restart(spark, provider[mode], inputs, current[mode],
                                                args.keys, partitions[-1], args.start)
                except Exception as e:  # noqa: BLE001
                    run.restart[mode] = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0]}"
                print(f"    {run.restart[mode]}", flush=True)
    finally:
        spark.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(f"\nkeys={args.keys:,} partitions={' -> '.join(map(str, partitions))} "
          f"spark changelog checkpointing={'on' if args.spark_changelog else 'off'} "
          f"load average={load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name, seconds in run.build_s.items():
        print(f"build {name}: {seconds:.1f} s, state/ {run.state_bytes[name] / 2**20:,.0f} MiB")
    print()
    print(report(run))
    for step in run.steps:
        if step.error:
            print(f"\n{step.mode} {step.from_partitions}->{step.to_partitions}: {step.error}")
    for mode, outcome in run.restart.items():
        print(f"restart {mode}: {outcome}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(run), indent=1))
    bad = any(s.error for s in run.steps) or any(
        not v.startswith("ok") for v in run.restart.values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
