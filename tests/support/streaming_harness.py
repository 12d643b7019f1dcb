"""Helpers for deterministic, restartable streaming queries in the Python integration tests.

Inputs are JSON-lines files read with an explicit schema and ``maxFilesPerTrigger=1``, so every
file is exactly one micro-batch (per source) and the batch plan is the same on every run.
Queries run with ``trigger(availableNow=True)``: each ``run`` processes everything written so far
and stops, and the next ``run`` on the same checkpoint restarts the query from it.
Outputs are collected through ``foreachBatch`` into a dict keyed by batch id, so a replayed batch
overwrites itself instead of being counted twice.
"""

from __future__ import annotations

import atexit
import datetime as dt
import decimal
import json
import os
import pickle
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import keyedstate
from keyedstate.spark_connect import is_connect
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from tests.support.paths import REPO

PROVIDER_CLASS_KEY = "spark.sql.streaming.stateStore.providerClass"
SPARK_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SPARK_HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"

# The reference every result is compared against.
REFERENCE_PROVIDER = SPARK_ROCKSDB_PROVIDER
# The provider under test. To check the harness itself against one of Spark's own providers, set
# KEYEDSTATE_TEST_PROVIDER to its class (e.g. SPARK_HDFS_PROVIDER's value).
PROVIDER_UNDER_TEST = os.environ.get("KEYEDSTATE_TEST_PROVIDER", keyedstate.PROVIDER_CLASS)

QUERY_TIMEOUT_S = 180.0

# Spark's Kafka connector for pyspark 4.3 (dev/connectors/spark-kafka/pom.xml, `make connectors`).
KAFKA_CONNECTOR_JARS = REPO / "build/connectors/spark-kafka"
# Hadoop's s3a connector (dev/storage/s3a/pom.xml, `make storage`), for checkpoints on s3a://.
S3A_JARS = REPO / "build/storage/s3a"
# Hadoop settings (JSON object) a subprocess driver's session starts with, e.g. an S3 endpoint's.
HADOOP_CONF_ENV = "KEYEDSTATE_TEST_HADOOP_CONF"

# Input files get strictly increasing modification times (the file source orders by them).
_MTIME_BASE = int(time.time()) - 24 * 3600


# The tests' Spark settings: their classic session's, and the Spark Connect server's.
TEST_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stateStore.maintenanceInterval": "2s",
    "spark.sql.streaming.minBatchesToRetain": "10",
    "spark.sql.streaming.pollingDelay": "10ms",
    "spark.python.worker.reuse": "true",
}


def extra_jars() -> list[str]:
    """Spark's Kafka source and sink, when `make connectors` fetched them (tests/sinks/), and
    s3a, when `make storage` fetched it (tests/storage/): jars load only at start."""
    return [
        str(jar)
        for folder in (KAFKA_CONNECTOR_JARS, S3A_JARS)
        for jar in sorted(folder.glob("*.jar"))
    ]


def session_builder(app_name: str, provider: str = PROVIDER_UNDER_TEST) -> SparkSession.Builder:
    """A small local-mode builder wired through ``keyedstate.configure``.

    When the provider under test is ours, the jar is required (a missing jar is an error). When it
    is one of Spark's (harness self-check), the jar is added if it exists.
    """
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in TEST_SETTINGS.items():
        builder = builder.config(key, value)
    if provider == keyedstate.PROVIDER_CLASS:
        builder = keyedstate.configure(builder)
    else:
        try:
            builder = keyedstate.configure(builder)
        except FileNotFoundError:
            pass
    extra = extra_jars()
    if extra:
        jars = [j for j in str(builder._options.get("spark.jars", "")).split(",") if j]
        builder = builder.config("spark.jars", ",".join(jars + extra))
    for key, value in json.loads(os.environ.get(HADOOP_CONF_ENV, "{}")).items():
        builder = builder.config(f"spark.hadoop.{key}", value)
    return builder.config(PROVIDER_CLASS_KEY, provider)


# ---------------------------------------------------------------------------------------------
# Inputs


@contextmanager
def session_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """``settings`` on the session for the duration (queries started meanwhile take them); then
    each key as it was (unset if it was)."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


class FileInput:
    """A directory of JSON-lines files; each ``add`` is one file (= one micro-batch)."""

    def __init__(self, directory: Path, schema: StructType) -> None:
        self.directory = directory
        self.schema = schema
        self.directory.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []

    def add(self, rows: Iterable[Mapping[str, Any]]) -> Path:
        index = len(self.files)
        final = self.directory / f"part-{index:05d}.json"
        # Spark's file source ignores names starting with "_" or "."; rename makes it atomic.
        staging = self.directory / f".part-{index:05d}.json.tmp"
        with staging.open("w") as out:
            for row in rows:
                out.write(json.dumps(dict(row), sort_keys=True) + "\n")
        mtime = _MTIME_BASE + index
        os.utime(staging, (mtime, mtime))
        os.replace(staging, final)
        self.files.append(final)
        return final

    def add_all(self, batches: Iterable[Iterable[Mapping[str, Any]]]) -> None:
        for rows in batches:
            self.add(rows)

    def read_stream(self, spark: SparkSession) -> DataFrame:
        return (
            spark.readStream.schema(self.schema)
            .option("maxFilesPerTrigger", 1)
            .json(str(self.directory))
        )


# ---------------------------------------------------------------------------------------------
# Outputs


def map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:  # noqa: ANN401 - any Spark value
    """``value`` with rows and dicts as dicts, lists and tuples as lists, and every other value
    (a leaf) as ``leaf`` makes it."""
    if isinstance(value, Row):
        return {k: map_leaves(v, leaf) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, dict):
        return {k: map_leaves(v, leaf) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [map_leaves(v, leaf) for v in value]
    return leaf(value)


def normalize(value: Any) -> Any:  # noqa: ANN401 - any Spark value
    """Turn a collected Spark value into plain, JSON-comparable Python values."""
    return map_leaves(value, _json_leaf)


def _json_leaf(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return value


def sort_rows(rows: Iterable[Any]) -> list[Any]:
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def rows_of(df: DataFrame) -> list[dict[str, Any]]:
    """All rows of a (batch) DataFrame as sorted plain dicts."""
    return sort_rows(normalize(row) for row in df.collect())


class BatchCollector:
    """A ``foreachBatch`` function that records each batch's rows, keyed by batch id.

    The rows go to files in a directory of its own, read back by ``batches`` and ``calls``: on
    Spark Connect the function runs in the server's Python process, not in the test's.
    """

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="keyedstate-batches-"))
        atexit.register(shutil.rmtree, self.directory, True)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = rows_of(df)
        part = self.directory / f".{batch_id}.pickle.tmp"
        part.write_bytes(pickle.dumps(rows))
        part.replace(self.directory / f"{batch_id}.pickle")  # a replayed batch replaces its rows
        with open(self.directory / "calls", "a") as calls:
            calls.write(f"{batch_id}\n")

    @property
    def batches(self) -> dict[int, list[dict[str, Any]]]:
        found = {int(f.name.split(".")[0]): f for f in self.directory.glob("*.pickle")}
        return {b: pickle.loads(found[b].read_bytes()) for b in sorted(found)}

    @property
    def calls(self) -> list[int]:
        """The batch ids of every call, in call order (a replayed batch twice)."""
        log = self.directory / "calls"
        return [int(line) for line in log.read_text().split()] if log.exists() else []

    def clear(self) -> None:
        """Forgets every batch recorded so far."""
        for f in self.directory.iterdir():
            f.unlink()

    def non_empty(self) -> dict[int, list[dict[str, Any]]]:
        return {b: rows for b, rows in self.batches.items() if rows}

    def all_rows(self) -> list[dict[str, Any]]:
        return [row for b in sorted(self.batches) for row in self.batches[b]]


# ---------------------------------------------------------------------------------------------
# Running queries


def start_query(
    spark: SparkSession,
    provider: str,
    df: DataFrame,
    output_mode: str,
    checkpoint: Path,
    collector: BatchCollector,
) -> StreamingQuery:
    """Start ``df`` with an availableNow trigger into ``collector``.

    The provider is set on the session right before the start: it is recorded in the
    checkpoint's offset log by the first batch (a restart keeps the recorded one).
    """
    spark.conf.set(PROVIDER_CLASS_KEY, provider)
    return (
        df.writeStream.outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(collector)
        .trigger(availableNow=True)
        .start()
    )


def await_finished(query: StreamingQuery, timeout_s: float = QUERY_TIMEOUT_S) -> None:
    finished = query.awaitTermination(timeout_s)
    if not finished:
        query.stop()
        raise AssertionError(f"query {query.name or query.id} did not finish in {timeout_s}s")
    error = query.exception()
    if error is not None:
        raise AssertionError(f"streaming query failed: {error}")


def refusal(
    spark: SparkSession, frame: DataFrame, checkpoint: Path, mode: str = "append"
) -> keyedstate.KeyedStateError:
    """The keyedstate error that fails ``frame``'s query on ``checkpoint`` before any batch."""
    import pytest
    from pyspark.errors import StreamingQueryException

    collector = BatchCollector()
    query = start_query(spark, PROVIDER_UNDER_TEST, frame, mode, checkpoint, collector)
    with pytest.raises(StreamingQueryException) as failure:
        await_finished(query)
    assert collector.batches == {}, collector.batches
    error = keyedstate.state_error(failure.value)
    assert error is not None, str(failure.value)[:3000]
    return error


class PhaseRun(NamedTuple):
    """One of the queries ``run_phase`` runs side by side: its inputs by source name, the
    provider, how the query is built from the inputs' streams, its checkpoint and collector."""

    inputs: Mapping[str, FileInput]
    provider: str
    build: Callable[[Mapping[str, DataFrame]], DataFrame]
    checkpoint: Path | str
    collector: BatchCollector


def run_phase(
    spark: SparkSession,
    phase: Mapping[str, Iterable[Iterable[Mapping[str, Any]]]],
    runs: Mapping[str, PhaseRun],
    output_mode: str,
) -> dict[str, StreamingQuery]:
    """One phase: ``phase[source]``'s files added to each run's inputs, every run's query started
    (availableNow, side by side) and awaited; any still active on a failure is stopped. The
    queries by run name.

    From a Spark Connect client each query runs alone, started once the previous one finished:
    each start spawns the server's ``foreachBatch`` Python worker, which Spark gives a fixed 10 s
    to connect back, and queries running beside it on two cores can make it miss that."""
    queries: dict[str, StreamingQuery] = {}
    one_by_one = is_connect(spark)
    try:
        for name, run in runs.items():
            for source, files in phase.items():
                run.inputs[source].add_all(files)
            frames = {source: src.read_stream(spark) for source, src in run.inputs.items()}
            queries[name] = start_query(
                spark, run.provider, run.build(frames), output_mode, run.checkpoint, run.collector
            )
            if one_by_one:
                await_finished(queries[name])
        for query in queries.values():
            await_finished(query)
    finally:
        for query in queries.values():
            if query.isActive:
                query.stop()
    return queries


@dataclass
class RunResult:
    provider: str
    checkpoint: Path
    collector: BatchCollector
    progresses: list[list[dict[str, Any]]] = field(default_factory=list)  # per run (phase)

    @property
    def batches(self) -> dict[int, list[dict[str, Any]]]:
        return self.collector.batches

    def last_progress_with_state(self) -> dict[str, Any]:
        for run in reversed(self.progresses):
            for progress in reversed(run):
                if progress.get("stateOperators"):
                    return progress
        raise AssertionError("no progress with state operators was reported")


def run_phases(
    spark: SparkSession,
    providers: Sequence[str],
    workdir: Path,
    sources: Mapping[str, StructType],
    phases: Sequence[Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]],
    build: Callable[[Mapping[str, DataFrame]], DataFrame],
    output_mode: str,
) -> dict[str, RunResult]:
    """Run one query in phases over the same checkpoint, once per provider.

    ``phases[i][source]`` is the list of files (each a list of rows) written to ``source`` before
    run ``i``; each run processes all input available and stops, the next restarts from the
    checkpoint. ``build`` gets the streaming DataFrames by source name and returns the query.
    The providers' queries (each with its own inputs and checkpoint) run side by side.
    """
    results: dict[str, RunResult] = {}
    inputs: dict[str, dict[str, FileInput]] = {}
    for n, provider in enumerate(providers):
        root = workdir / f"{n}-{provider.rsplit('.', 1)[-1]}"
        root.mkdir(parents=True, exist_ok=True)
        inputs[provider] = {
            name: FileInput(root / "input" / name, schema) for name, schema in sources.items()
        }
        results[provider] = RunResult(
            provider=provider, checkpoint=root / "checkpoint", collector=BatchCollector()
        )
    runs = {
        provider: PhaseRun(inputs[provider], provider, build, result.checkpoint, result.collector)
        for provider, result in results.items()
    }
    for phase in phases:
        queries = run_phase(spark, phase, runs, output_mode)
        for provider, query in queries.items():
            progress = [json.loads(p.json) for p in query.recentProgress]
            results[provider].progresses.append(progress)
    for provider, result in results.items():
        recorded = recorded_provider(result.checkpoint)
        assert recorded == provider, f"{result.checkpoint} records provider {recorded}"
    return results


def recorded_provider(checkpoint: Path) -> str | None:
    """The state store provider class recorded in the checkpoint's first offset log entry."""
    offsets = checkpoint / "offsets"
    entries = sorted((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    for line in entries[0].read_text().splitlines():
        if line.startswith("{") and "batchWatermarkMs" in line:
            conf = json.loads(line).get("conf", {})
            return conf.get(PROVIDER_CLASS_KEY)
    return None


def committed_batches(checkpoint: Path) -> list[int]:
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return []
    return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())


def planned_batches(checkpoint: Path) -> list[int]:
    offsets = checkpoint / "offsets"
    if not offsets.is_dir():
        return []
    return sorted(int(p.name) for p in offsets.iterdir() if p.name.isdigit())


def diff_batches(
    expected: Mapping[int, list[Any]], actual: Mapping[int, list[Any]], limit: int = 5
) -> str:
    """A readable description of how two per-batch outputs differ ('' if they are equal)."""
    lines = []
    for batch in sorted(set(expected) | set(actual)):
        if batch not in actual:
            lines.append(f"batch {batch}: missing (expected {expected[batch][:limit]})")
        elif batch not in expected:
            lines.append(f"batch {batch}: unexpected batch {actual[batch][:limit]}")
        elif expected[batch] != actual[batch]:
            exp = [json.dumps(r, sort_keys=True) for r in expected[batch]]
            act = [json.dumps(r, sort_keys=True) for r in actual[batch]]
            only_exp = [r for r in exp if r not in act][:limit]
            only_act = [r for r in act if r not in exp][:limit]
            lines.append(
                f"batch {batch}: {len(exp)} vs {len(act)} rows; only in reference {only_exp}; "
                f"only in provider under test {only_act}"
            )
    return "\n".join(lines)


def kill_process_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a driver started in its own process group, and wait until nothing of the group
    (the JVM in particular) is left to touch the checkpoint."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process group {proc.pid} survived SIGKILL")
