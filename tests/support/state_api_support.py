"""Helpers shared by the Python state API tests (tests/api/test_state_api_*.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import keyedstate
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from tests.support.streaming_harness import (
    PROVIDER_CLASS_KEY,
    PROVIDER_UNDER_TEST,
    QUERY_TIMEOUT_S,
    BatchCollector,
    FileInput,
    PhaseRun,
    RunResult,
    committed_batches,
    recorded_provider,
    run_phase,
)

# Keyed functions run on keyedstate's provider only (their declaration lives in its manifests).
PROVIDERS = {"keyedstate": PROVIDER_UNDER_TEST}

Rows = list[dict[str, Any]]
Build = Callable[[Mapping[str, DataFrame]], DataFrame]


def ship_by_value(module_name: str) -> None:
    """Test modules are not importable on executors: pickle their functions by value."""
    cloudpickle.register_pickle_by_value(sys.modules[module_name])


def run_jobs(
    spark: SparkSession,
    workdir: Path,
    sources: Mapping[str, StructType],
    phases: Sequence[Mapping[str, Sequence[Rows]]],
    jobs: Mapping[str, tuple[str, Build]],
    output_mode: str = "append",
) -> dict[str, RunResult]:
    """Runs queries side by side, phase by phase: ``jobs[name] = (provider, build)``.

    Each job has its own copy of the inputs and its own checkpoint. In each phase the phase's
    files are added, every query is started (availableNow) and awaited; the next phase restarts
    each query from its checkpoint. Spark runs one applyInPandasWithState per query, hence one
    query per function (one keyed function per query keeps the scenarios independent).
    """
    results: dict[str, RunResult] = {}
    runs: dict[str, PhaseRun] = {}
    for name, (provider, build) in jobs.items():
        root = workdir / name
        inputs = {s: FileInput(root / "input" / s, schema) for s, schema in sources.items()}
        result = results[name] = RunResult(provider, root / "checkpoint", BatchCollector())
        runs[name] = PhaseRun(inputs, provider, build, result.checkpoint, result.collector)
    for phase in phases:
        queries = run_phase(spark, phase, runs, output_mode)
        for name, query in queries.items():
            results[name].progresses.append([json.loads(p.json) for p in query.recentProgress])
    for name, result in results.items():
        recorded = recorded_provider(result.checkpoint)
        assert recorded == result.provider, f"{name}: checkpoint records {recorded}"
    return results


def on_keyedstate(build: Build) -> dict[str, tuple[str, Build]]:
    return {label: (provider, build) for label, provider in PROVIDERS.items()}


def stored_state(spark: SparkSession, checkpoint: Path, state: str) -> list[dict[str, Any]]:
    """The committed rows of one state of the query's keyed function (``keyedstate.state.read``),
    without the partition column, sorted."""
    rows = keyedstate.state.read(spark, str(checkpoint), state=state).drop("partition_id").collect()
    return sorted((r.asDict(recursive=True) for r in rows), key=repr)


class TimedRun:
    """Queries on a processing-time trigger, fed one file (one micro-batch) at planned times.

    ``jobs[name] = (provider, build)``; every job gets its own copy of each file. ``feed`` waits
    until every query has finished the previous file, then until the planned time, and writes
    the next file; ``restart`` stops the queries (between batches) and starts them again from
    their checkpoints.
    """

    def __init__(
        self,
        spark: SparkSession,
        workdir: Path,
        schema: StructType,
        jobs: Mapping[str, tuple[str, Build]],
        trigger: str = "100 milliseconds",
    ) -> None:
        self.spark = spark
        self.jobs = jobs
        self.trigger = trigger
        self.inputs = {name: FileInput(workdir / name / "input", schema) for name in jobs}
        self.results = {
            name: RunResult(provider, workdir / name / "checkpoint", BatchCollector())
            for name, (provider, _) in jobs.items()
        }
        self.queries: dict[str, Any] = {}
        self.files = 0
        self.origin = time.monotonic()

    def start(self) -> None:
        # Processing-time queries run a micro-batch per trigger: keep every offset log entry, so
        # batch_metadata() sees each batch's time and watermark.
        retain = "spark.sql.streaming.minBatchesToRetain"
        previous = self.spark.conf.get(retain)
        self.spark.conf.set(retain, "100000")
        try:
            self._start_queries()
        finally:
            self.spark.conf.set(retain, previous)

    def _start_queries(self) -> None:
        for name, (provider, build) in self.jobs.items():
            self.spark.conf.set(PROVIDER_CLASS_KEY, provider)
            frame = build({"events": self.inputs[name].read_stream(self.spark)})
            self.queries[name] = (
                frame.writeStream.outputMode("append")
                .option("checkpointLocation", str(self.results[name].checkpoint))
                .foreachBatch(self.results[name].collector)
                .trigger(processingTime=self.trigger)
                .start()
            )

    def _committed(self, name: str) -> int:
        return len(committed_batches(self.results[name].checkpoint))

    def wait_idle(self, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        """Until every query has committed a batch for every file written so far."""
        deadline = time.monotonic() + timeout_s
        for name, query in self.queries.items():
            while self._committed(name) < self.files:
                if query.exception() is not None:
                    raise AssertionError(f"{name} failed: {query.exception()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name} did not process file {self.files - 1}")
                time.sleep(0.05)

    def anchor(self, epoch_ms: int) -> None:
        """Measure ``feed`` times from this wall-clock instant (e.g. a batch's timestamp)."""
        self.origin = time.monotonic() - (time.time() - epoch_ms / 1000)

    def feed(self, at_s: float, rows: Rows) -> None:
        """Writes ``rows`` as the next file ``at_s`` seconds after the origin (the run's creation
        or the ``anchor``), or right away when the previous batch finished later than that."""
        self.wait_idle()
        delay = self.origin + at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for source in self.inputs.values():
            source.add(rows)
        self.files += 1

    def wait_for(self, condition: Callable[[], bool], timeout_s: float = QUERY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            for name, query in self.queries.items():
                if query.exception() is not None:
                    raise AssertionError(f"{name} failed: {query.exception()}")
            if time.monotonic() > deadline:
                state = {
                    name: {
                        "committed": self._committed(name),
                        "status": self.queries[name].status if name in self.queries else None,
                        "outputs": result.collector.non_empty(),
                    }
                    for name, result in self.results.items()
                }
                raise AssertionError(
                    f"timed out after {timeout_s}s waiting for {condition.__name__}: {state}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        self.wait_idle()
        for query in self.queries.values():
            # Stop between micro-batches: Spark 4.3 can hit a StackOverflowError while
            # classifying the interruption of a running Python task (harmless, but noisy).
            deadline = time.monotonic() + 10
            while query.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.01)
            query.stop()
        for name, query in self.queries.items():
            if query.exception() is not None:
                raise AssertionError(f"{name} failed: {query.exception()}")
        self.queries = {}

    def restart(self) -> None:
        self.stop()
        self.start()


def batch_metadata(checkpoint: Path) -> dict[int, tuple[int, int]]:
    """``batch id -> (watermark ms, processing timestamp ms)`` from the checkpoint's offset log:
    the watermark and time every stateful operator saw in that batch."""
    out = {}
    for entry in (checkpoint / "offsets").iterdir():
        if not entry.name.isdigit():
            continue
        for line in entry.read_text().splitlines():
            if line.startswith("{") and "batchWatermarkMs" in line:
                meta = json.loads(line)
                out[int(entry.name)] = (meta["batchWatermarkMs"], meta["batchTimestampMs"])
    return dict(sorted(out.items()))
