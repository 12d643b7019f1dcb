"""Driver for tests/provider/test_executors.py: stateful queries on a standalone cluster while
executors misbehave, each beside an uninterrupted reference run in the same application. Prints one
JSON line ``SUMMARY {...}``.

usage: executor_job.py MASTER_URL WORKDIR MODE ENGINES

ENGINES: comma-separated, ``aggregation`` (Spark's streaming aggregation on keyedstate's
provider) and/or ``python-api`` (a keyedstate Python API keyed function).

MODE ``speculation``: ``spark.speculation`` on with aggressive settings. For each engine one
micro-batch holds a key (``slow-<n>``) whose processing sleeps in the task's first attempt only
(``TaskContext.attemptNumber() == 0``): for the aggregation in a filter after the state store's
save (the first attempt commits its state version, then hangs), for the keyed function inside the
function (the first attempt hangs before its commit). Spark launches a speculative copy on the
other worker's host, which loads the version from the checkpoint, commits and wins; the first
attempt is killed. The query continues, is stopped and restarted on its checkpoint. The event log
tells which tasks were speculative and how each attempt ended.

MODE ``snapshot-loss``: the checkpoint is on ``slowupload://``
(tests/support/jvm/SlowUploadFileSystem.java, on the class path through
``spark.{driver,executor}.extraClassPath``). After batch ARM_AFTER the next background snapshot
upload of an SST file hangs in its executor; the driver waits until it does, SIGKILLs that executor,
and the query goes on with the executor the master starts instead, then a restart; for each engine.

Both modes record every batch's output (``foreachBatch``, keyed by batch id) of the run under
test and of the reference run, and the values computed here in plain Python.
"""

from __future__ import annotations

import script_paths  # noqa: F401 - first: puts the repository and the package on sys.path

# isort: split

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keyedstate
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.keyed_functions import CountSum, last_per_key
from tests.support.servers.spark_standalone import executor_pids, job_builder

SCHEMA = StructType([StructField("key", StringType()), StructField("v", LongType())])
PHASE_1_FILES = 5  # files 0..4 before the restart
PHASE_2_FILES = 2  # files 5..6 after it
SLOW_FILE = 2  # speculation: the micro-batch with the slow key
SLOW_S = 60  # how long the first attempt sleeps; it is killed long before
ARM_AFTER = 2  # snapshot-loss: arm the hanging upload after this batch
WAIT_S = 120.0


def rows_for(n: int, slow: bool) -> list[dict[str, Any]]:
    rows = [{"key": f"k{(n * 3 + i) % 10}", "v": n * 100 + i} for i in range(30)]
    if slow:
        rows.append({"key": f"slow-{n}", "v": n})
    return rows


def write_file(folder: Path, n: int, slow: bool) -> None:
    tmp = folder / f".part-{n:03d}"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows_for(n, slow)))
    tmp.rename(folder / f"part-{n:03d}.json")


def expected_batches(files: int, slow_file: int | None) -> dict[int, list[dict[str, Any]]]:
    """Each batch's output computed in plain Python: per key updated, its count and sum so far."""
    cnt: dict[str, int] = {}
    total: dict[str, int] = {}
    batches = {}
    for n in range(files):
        updated = set()
        for row in rows_for(n, n == slow_file):
            cnt[row["key"]] = cnt.get(row["key"], 0) + 1
            total[row["key"]] = total.get(row["key"], 0) + row["v"]
            updated.add(row["key"])
        batches[n] = [{"key": k, "cnt": cnt[k], "total": total[k]} for k in sorted(updated)]
    return batches


def slow_first_attempt(key: str, slow_s: float, attempts: str) -> None:
    """For the slow key: note which task attempt processes it (``<attempts>/<stage>-<partition>-
    <attempt>``, matched with the event log's tasks), and sleep in the first attempt."""
    from pyspark import TaskContext

    task = TaskContext.get()
    if not key.startswith("slow-") or task is None:
        return
    Path(attempts).mkdir(parents=True, exist_ok=True)
    Path(attempts, f"{task.stageId()}-{task.partitionId()}-{task.attemptNumber()}").touch()
    if slow_s and task.attemptNumber() == 0:
        time.sleep(slow_s)


class SlowCountSum(CountSum):
    """CountSum whose slow key hangs the first attempt."""

    def __init__(self, slow_s: float, attempts: str) -> None:
        self.slow_s = slow_s
        self.attempts = attempts

    def process_element(self, value, ctx):  # noqa: ANN001, ANN201
        slow_first_attempt(value.key, self.slow_s, self.attempts)
        yield from super().process_element(value, ctx)


def build(engine: str, events: DataFrame, slow_s: float, attempts: str) -> DataFrame:
    if engine == "python-api":
        return keyedstate.key_by(events, "key").process(
            SlowCountSum(slow_s, attempts), "key string, cnt long, total long"
        )
    counts = events.groupBy("key").agg(F.count(F.lit(1)).alias("cnt"), F.sum("v").alias("total"))

    def passes(key: str) -> bool:
        slow_first_attempt(key, slow_s, attempts)
        return True

    # Nondeterministic: the optimizer must not push the filter below the aggregation (into the
    # shuffle's map side); it runs in the stateful task, after the state store's save.
    passes_udf = F.udf(passes, "boolean").asNondeterministic()
    return counts.filter(passes_udf("key"))


class Run:
    """One query over one input folder and checkpoint, stopped and restarted between phases."""

    def __init__(self, spark: SparkSession, label: str, engine: str, root: str, local_root: Path,
                 slow_file: int | None, slow_s: float) -> None:
        self.spark, self.label, self.engine = spark, label, engine
        self.checkpoint = f"{root}/checkpoint"
        self.local_checkpoint = local_root / "checkpoint"
        self.events = local_root / "events"
        self.events.mkdir(parents=True, exist_ok=True)
        self.slow_file, self.slow_s = slow_file, slow_s
        self.attempts = local_root / "attempts"
        self.batches: dict[int, list[dict[str, Any]]] = {}

    def sink(self, df: DataFrame, batch_id: int) -> None:
        rows = [r.asDict() for r in df.collect()]
        rows = last_per_key(rows) if self.engine == "python-api" else sorted(
            rows, key=lambda r: r["key"])
        self.batches[batch_id] = rows

    def phase(self, files: range, after_batch: Callable[[int], None] = lambda n: None) -> None:
        stream = (self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                  .json(str(self.events)))
        query: StreamingQuery = (
            build(self.engine, stream, self.slow_s, str(self.attempts))
            .writeStream.outputMode("update")
            .option("checkpointLocation", self.checkpoint).foreachBatch(self.sink)
            .queryName(self.label.replace("-", "_")).start()
        )
        try:
            for n in files:
                write_file(self.events, n, n == self.slow_file)
                query.processAllAvailable()
                after_batch(n)
        finally:
            query.stop()
        if query.exception() is not None:
            raise RuntimeError(f"{self.label}: {query.exception()}")

    def run(self, after_batch: Callable[[int], None] = lambda n: None) -> Run:
        self.phase(range(PHASE_1_FILES), after_batch)
        self.phase(range(PHASE_1_FILES, PHASE_1_FILES + PHASE_2_FILES), after_batch)
        return self

    def summary(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "checkpoint": self.checkpoint,
            "local_checkpoint": str(self.local_checkpoint),
            # (stage, partition, attempt) of each task attempt that processed the slow key.
            "slow_key_attempts": sorted(
                [int(x) for x in p.name.split("-")] for p in self.attempts.glob("*-*-*")
            ),
            "batches": {str(b): rows for b, rows in sorted(self.batches.items())},
            "expected": {
                str(b): rows for b, rows in
                expected_batches(PHASE_1_FILES + PHASE_2_FILES, self.slow_file).items()
            },
        }


def session(master: str, workdir: Path, mode: str) -> SparkSession:
    builder = (
        job_builder(master, f"keyedstate-executors-{mode}")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", str(workdir / "eventlog"))
        .config("spark.eventLog.compress", "false")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "2s")
        # Snapshots every 2 versions: background uploads happen all along.
        .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
    )
    if os.environ.get("PYTHONPATH"):  # the executors' Python workers import keyedstate too
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    if mode == "speculation":
        builder = (
            builder.config("spark.speculation", "true")
            .config("spark.speculation.interval", "100ms")
            .config("spark.speculation.quantile", "0.5")
            .config("spark.speculation.multiplier", "2")
            .config("spark.speculation.minTaskRuntime", "1s")
            # Judge by duration alone: the sleeping attempt reads as much as the others.
            .config("spark.speculation.efficiency.enabled", "false")
        )
    else:
        classes = os.environ["SLOW_UPLOAD_CLASSES"]
        builder = (
            builder.config("spark.driver.extraClassPath", classes)
            .config("spark.executor.extraClassPath", classes)
            .config("spark.hadoop.fs.slowupload.impl", "SlowUploadFileSystem")
            .config("spark.hadoop.keyedstate.test.slowUpload.dir", str(workdir / "markers"))
        )
    spark = keyedstate.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def task_events(eventlog: Path) -> dict[str, Any]:
    """From the event log: every task attempt (stage, partition, attempt, whether it was
    speculative, its executor and host, how it ended) and the executors added and removed."""
    tasks: dict[tuple[int, int, int], dict[str, Any]] = {}
    added, removed = [], []
    # Spark 4.3 rolls event logs: eventlog_v2_<app>/events_<n>_<app>[.inprogress].
    for log in sorted(eventlog.rglob("events_*")):
        for line in log.read_text().splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            kind = event["Event"]
            if kind == "SparkListenerExecutorAdded":
                added.append(event["Executor ID"])
            elif kind == "SparkListenerExecutorRemoved":
                removed.append(event["Executor ID"])
            elif kind in ("SparkListenerTaskStart", "SparkListenerTaskEnd"):
                info = event["Task Info"]
                key = (event["Stage ID"], info.get("Partition ID", info["Index"]), info["Attempt"])
                task = tasks.setdefault(key, {
                    "stage": key[0], "partition": key[1], "attempt": key[2],
                    "speculative": info["Speculative"], "executor": info["Executor ID"],
                    "host": info["Host"], "end": None, "launched_ms": info["Launch Time"],
                })
                if kind == "SparkListenerTaskEnd":
                    reason = event["Task End Reason"]
                    task["end"] = reason["Reason"]
                    task["kill_reason"] = reason.get("Kill Reason")
    return {
        "tasks": sorted(tasks.values(), key=lambda t: (t["stage"], t["partition"], t["attempt"])),
        "executors_added": added,
        "executors_removed": removed,
    }


def speculation(spark: SparkSession, workdir: Path, engines: list[str]) -> dict[str, Any]:
    runs = []
    for engine in engines:
        for label, slow in ((f"reference-{engine}", 0.0), (f"speculative-{engine}", SLOW_S)):
            local = workdir / label
            # The same input for both; only the run under test sleeps in its first attempts.
            run = Run(spark, label, engine, str(local), local, SLOW_FILE, slow)
            runs.append(run.run())
            if slow:
                await_attempts_ended(spark, run, timeout_s=SLOW_S + 30)
    return {"runs": {r.label: r.summary() for r in runs}}


def await_attempts_ended(spark: SparkSession, run: Run, timeout_s: float) -> None:
    """Waits until every attempt at the slow key has ended: the killed first attempt's end is
    posted after its stage completed, and the event log only has what happened before stop."""
    tracker = spark.sparkContext.statusTracker()
    stages = {int(p.name.split("-")[0]) for p in run.attempts.glob("*-*-*")}
    deadline = time.monotonic() + timeout_s
    while True:
        infos = {s: tracker.getStageInfo(s) for s in stages}
        running = {s: i.numActiveTasks for s, i in infos.items() if i is None or i.numActiveTasks}
        if not running:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{run.label}: attempts at the slow key still running after "
                               f"{timeout_s}s (stage: active tasks, None if unknown): {running}")
        time.sleep(0.2)


def snapshot_loss(spark: SparkSession, workdir: Path, engines: list[str]) -> dict[str, Any]:

    markers = workdir / "markers"
    markers.mkdir(parents=True)
    killed: dict[str, dict[str, Any]] = {}

    def fired() -> Path | None:
        found = [p for p in markers.glob("fired-*") if p.read_text()]
        return found[0] if found else None

    def arm_then_kill(engine: str, n: int) -> None:
        if n == ARM_AFTER:
            for old in markers.iterdir():
                old.unlink()
            (markers / "armed").write_text("")
        elif n == ARM_AFTER + 1:
            # Batch n committed and took its snapshot; its upload now hangs in some executor.
            deadline = time.monotonic() + WAIT_S
            while fired() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            marker = fired()
            if marker is None:
                raise RuntimeError(f"no snapshot upload took the arm within {WAIT_S}s")
            pid = int(marker.name.removeprefix("fired-"))
            executors = executor_pids()
            if pid not in executors:
                raise RuntimeError(f"the hanging upload's process {pid} is not an executor "
                                   f"({executors})")
            os.kill(pid, signal.SIGKILL)
            killed[engine] = {"pid": pid, "uploading": marker.read_text(), "after_batch": n}
            # The next batches run on the executors left (and any the master starts).

    runs = []
    for engine in engines:
        root = workdir / engine
        runs.append(Run(spark, f"reference-{engine}", engine, str(root / "reference"),
                        root / "reference", None, 0.0).run())
        local = root / "killed"
        runs.append(Run(spark, f"killed-{engine}", engine, f"slowupload://{local}", local, None,
                        0.0).run(lambda n, engine=engine: arm_then_kill(engine, n)))
    return {"runs": {r.label: r.summary() for r in runs}, "killed": killed}


def main(master: str, workdir: Path, mode: str, engines: list[str]) -> dict[str, Any]:
    (workdir / "eventlog").mkdir(parents=True, exist_ok=True)
    spark = session(master, workdir, mode)
    app_id = spark.sparkContext.applicationId
    started = time.monotonic()
    try:
        summary = (speculation(spark, workdir, engines) if mode == "speculation"
                   else snapshot_loss(spark, workdir, engines))
    finally:
        spark.stop()
    summary["app_id"] = app_id
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary.update(task_events(workdir / "eventlog"))
    return summary


if __name__ == "__main__":
    result = main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4].split(","))
    print("SUMMARY " + json.dumps(result), flush=True)
