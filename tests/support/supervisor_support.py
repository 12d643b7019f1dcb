"""Shared pieces of the supervisor tests (test_restart_strategies.py, test_checkpoint_config.py):
a keyed count over JSON-lines files, a foreachBatch sink that fails or stalls on chosen calls,
and a listener that records its callbacks in order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import LongType, StructField, StructType

from tests.support.streaming_harness import (
    PROVIDER_CLASS_KEY,
    BatchCollector,
    FileInput,
    await_finished,
    start_query,
)

SCHEMA = StructType([StructField("k", LongType()), StructField("v", LongType())])
# Three files (= three batches) of a few rows over three keys.
FILES = [[{"k": i % 3, "v": i} for i in range(4 * b, 4 * b + 4)] for b in range(3)]
# Fast polling keeps the tests quick; the default (0.1 s) is for production.
POLL = 0.05


def counts(spark: SparkSession, source: FileInput) -> DataFrame:
    """A stateful keyed aggregation: the state lives in the provider under test."""
    return source.read_stream(spark).groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v").alias("total")
    )


def writer(
    spark: SparkSession, source: FileInput, checkpoint: Path | None, sink: Callable[..., None]
) -> DataStreamWriter:
    spark.conf.set(PROVIDER_CLASS_KEY, keyedstate.PROVIDER_CLASS)
    w = counts(spark, source).writeStream.outputMode("update").foreachBatch(sink)
    return w.option("checkpointLocation", str(checkpoint)) if checkpoint else w


def input_files(folder: Path, files: list[list[dict[str, Any]]] = FILES) -> FileInput:
    """``files`` written as the query's input at ``folder`` (``<tmp_path>/in`` in the tests)."""
    source = FileInput(folder, SCHEMA)
    source.add_all(files)
    return source


def reference_batches(spark: SparkSession, workdir: Path) -> dict[int, list[dict[str, Any]]]:
    """The output of an uninterrupted availableNow run over FILES."""
    source = input_files(workdir / "reference-in")
    collector = BatchCollector()
    query = start_query(
        spark, keyedstate.PROVIDER_CLASS, counts(spark, source), "update",
        workdir / "reference-ck", collector,
    )
    await_finished(query)
    return collector.batches


def fails_naming(make: Callable[[], object], error: type[Exception], words: list[str]) -> None:
    """``make()`` raises ``error`` whose message names every one of ``words`` (the setting or
    argument, its value, the rule)."""
    with pytest.raises(error) as failure:
        make()
    for word in words:
        assert word in str(failure.value), (word, str(failure.value))


class FlakySink:
    """Collects batches, but on the calls numbered in ``fail`` (1-based, over all attempts) it
    raises after collecting (the batch's state was already committed by its tasks), and on the
    calls in ``stall`` it first waits ``stall_s``, or until ``release`` is set (a listener sets
    it when the stall is noticed, so tests with long timeouts do not wait for nothing; in the
    test's process only: classic sessions)."""

    def __init__(
        self,
        fail: Iterable[int] = (),
        stall: Iterable[int] = (),
        stall_s: float = 0.0,
        error: Callable[[int, int], BaseException] | None = None,
        after: Callable[[int, int], None] | None = None,
    ) -> None:
        self.collector = BatchCollector()
        self.fail = set(fail)
        self.stall = set(stall)
        self.stall_s = stall_s
        self.error = error or (lambda call, batch: RuntimeError(
            f"injected failure on call {call} (batch {batch})"
        ))
        self.after = after
        self.release = threading.Event()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into the Connect server's Python process, whose copy gets an Event of its own.
        return {k: v for k, v in self.__dict__.items() if k != "release"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, release=threading.Event())

    @property
    def calls(self) -> int:
        """How many times it was called, over every attempt (counted in the collector's folder:
        on Spark Connect each attempt calls its own copy in the server's Python process)."""
        log = self.collector.directory / "sink-calls"
        return len(log.read_text()) if log.exists() else 0

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with open(self.collector.directory / "sink-calls", "a") as log:
            log.write("+")  # one query calls it from one thread at a time
        call = self.calls
        if call in self.stall:
            self.release.clear()
            self.release.wait(self.stall_s)
        self.collector(df, batch_id)
        if call in self.fail:
            raise self.error(call, batch_id)
        if self.after is not None:
            self.after(call, batch_id)


class RecordingListener(keyedstate.SupervisorListener):
    """Records every callback as a tuple, in order; a checkpoint timeout sets ``release``."""

    def __init__(self, release: threading.Event | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.release = release

    def on_start(self, query: StreamingQuery, attempt: int) -> None:
        self.events.append(("start", attempt))

    def on_restart(self, attempt: int, cause: BaseException, delay: float) -> None:
        self.events.append(("restart", attempt, cause, delay))

    def on_failure(self, cause: BaseException) -> None:
        self.events.append(("failure", cause))

    def on_terminated(self, query: StreamingQuery | None, cancelled: bool) -> None:
        self.events.append(("terminated", cancelled))

    def on_checkpoint_timeout(
        self, query: StreamingQuery, batch_id: int | None, elapsed: float
    ) -> None:
        self.events.append(("timeout", batch_id, elapsed))
        if self.release is not None:
            self.release.set()

    def on_min_pause_violated(self, query: StreamingQuery, batch_id: int, pause: float) -> None:
        self.events.append(("pause", batch_id, pause))

    def kinds(self) -> list[str]:
        return [e[0] for e in self.events]


def no_query_left(spark: SparkSession) -> None:
    """Stop anything a failed assertion left running, so the next test starts clean."""
    for query in spark.streams.active:
        query.stop()


def stop_when(supervisor: keyedstate.Supervisor, condition: Callable[[], bool]) -> threading.Thread:
    """Stops ``supervisor`` as a user would, from another thread, once ``condition()`` holds
    (polled: a sink's own callback cannot reach the test's process on Spark Connect)."""

    def stop() -> None:
        deadline = time.monotonic() + 120
        while not (condition() and supervisor.query is not None):
            if time.monotonic() > deadline:
                break  # stop anyway: the test's assertions say what did not happen
            time.sleep(0.02)
        supervisor.stop()

    thread = threading.Thread(target=stop, daemon=True)
    thread.start()
    return thread
