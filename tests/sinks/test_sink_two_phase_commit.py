"""The generic two-phase-commit sink (Flink's TwoPhaseCommitSinkFunction per micro-batch), through
a sink a user would write: JSON-lines files, one per transaction, made visible by an atomic
rename. The template's contract without Spark, then real streaming queries in both scopes (one
transaction per batch on the driver, one per partition on the executors)."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest
from keyedstate.sinks import (
    BatchAlreadyCommitted,
    TransactionContext,
    TransactionScope,
    TwoPhaseCommitSink,
    WriteOutcome,
)
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.sinks.sink_support import FailAfterCommit, run
from tests.support.state_api_support import ship_by_value
from tests.support.streaming_harness import FileInput, committed_batches

ship_by_value(__name__)  # the sinks below travel to the executors in partition scope

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("word", T.StringType())])
WORDS = ["apple", "pear", "fig"]


# ---------------------------------------------------------------------------------------------
# A user-written sink (the example of docs/exactly-once.md)


@dataclass
class FileTransaction:
    staging: Path
    final: Path
    out: TextIO


class JsonFileSink(TwoPhaseCommitSink[FileTransaction]):
    """Each transaction is a hidden staging file; commit renames it to its final name, so the
    final file's existence is the durable record ``is_committed`` reads."""

    def __init__(self, directory: Path, scope: TransactionScope, sink_id: str | None = None):
        super().__init__(sink_id)
        self.directory, self.scope = directory, scope

    def final_path(self, context: TransactionContext) -> Path:
        part = "all" if context.partition_id is None else f"p{context.partition_id}"
        return self.directory / context.sink_id / f"batch-{context.batch_id:06d}-{part}.jsonl"

    def is_committed(self, context: TransactionContext) -> bool:
        return self.final_path(context).exists()

    def recover_and_abort(self, context: TransactionContext) -> None:
        final = self.final_path(context)
        for stale in final.parent.glob(f".{final.name}.*"):  # a crashed attempt's staging file
            stale.unlink(missing_ok=True)

    def begin_transaction(self, context: TransactionContext) -> FileTransaction:
        final = self.final_path(context)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = final.with_name(f".{final.name}.{uuid.uuid4().hex}")
        return FileTransaction(staging, final, staging.open("w"))

    def invoke(self, transaction: FileTransaction, rows: Iterable[Row]) -> None:
        for row in rows:
            transaction.out.write(json.dumps(row.asDict(), sort_keys=True) + "\n")

    def pre_commit(self, transaction: FileTransaction) -> None:
        transaction.out.flush()
        os.fsync(transaction.out.fileno())
        transaction.out.close()

    def commit(self, transaction: FileTransaction) -> None:
        os.rename(transaction.staging, transaction.final)  # atomic on one file system

    def abort(self, transaction: FileTransaction) -> None:
        transaction.out.close()
        transaction.staging.unlink(missing_ok=True)


class InstrumentedFileSink(JsonFileSink):
    """Logs each outcome to a file and fails where a marker file says, once per marker (files,
    because in partition scope each task has its own copy of the sink)."""

    def __init__(self, root: Path, scope: TransactionScope) -> None:
        super().__init__(root / "out", scope)
        self.root = root

    def fail_once(self, step: str, batch_id: int) -> None:
        (self.root / f"fail-{step}-{batch_id}").touch()

    def _maybe_fail(self, step: str, transaction: FileTransaction) -> None:
        batch_id = int(transaction.final.name.split("-")[1])
        try:
            (self.root / f"fail-{step}-{batch_id}").unlink()
        except FileNotFoundError:
            return  # no marker, or another partition's task took it
        raise RuntimeError(f"injected failure in {step} of batch {batch_id}")

    def write(self, context: TransactionContext, rows: Iterable[Row]) -> WriteOutcome:
        outcome = super().write(context, rows)
        with (self.root / "outcomes.log").open("a") as log:
            log.write(f"{context.batch_id} {context.partition_id} {outcome.value}\n")
        return outcome

    def invoke(self, transaction: FileTransaction, rows: Iterable[Row]) -> None:
        super().invoke(transaction, rows)
        self._maybe_fail("invoke", transaction)

    def pre_commit(self, transaction: FileTransaction) -> None:
        super().pre_commit(transaction)
        self._maybe_fail("pre_commit", transaction)

    def outcomes(self) -> list[tuple[int, str]]:
        path = self.root / "outcomes.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return sorted((int(b), outcome) for b, _, outcome in (line.split() for line in lines))

    def committed_rows(self) -> dict[int, list[dict[str, Any]]]:
        """Visible output by batch (staging files are invisible, as a reader would skip them)."""
        result: dict[int, list[dict[str, Any]]] = {}
        for path in sorted(self.directory.rglob("batch-*.jsonl")):
            batch_id = int(path.name.split("-")[1])
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            result.setdefault(batch_id, []).extend(rows)
        return {b: sorted(rows, key=json.dumps) for b, rows in result.items()}

    def leftovers(self) -> list[Path]:
        return [p for p in self.directory.rglob(".batch-*")]


def inputs(batches: int) -> list[list[dict[str, Any]]]:
    return [
        [{"id": b * 100 + i, "word": WORDS[(b + i) % len(WORDS)]} for i in range(12)]
        for b in range(batches)
    ]


SCOPES = [TransactionScope.BATCH, TransactionScope.PARTITION]


# ---------------------------------------------------------------------------------------------
# The template, without Spark


class Recorder(TwoPhaseCommitSink[list[str]]):
    """Records the calls; fails at the step named in ``fail``."""

    def __init__(self, fail: str = "", committed: bool = False) -> None:
        super().__init__("recorder")
        self.calls: list[str] = []
        self.fail, self.committed = fail, committed

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if self.fail == name:
            raise RuntimeError(f"{name} failed")
        if self.fail == f"{name}:raced":
            raise BatchAlreadyCommitted("another attempt committed")

    def is_committed(self, context: TransactionContext) -> bool:
        self.calls.append("is_committed")
        return self.committed

    def begin_transaction(self, context: TransactionContext) -> list[str]:
        self._step("begin_transaction")
        return []

    def invoke(self, transaction: list[str], rows: Iterable[Row]) -> None:
        transaction.extend(str(r) for r in rows)
        self._step("invoke")

    def pre_commit(self, transaction: list[str]) -> None:
        self._step("pre_commit")

    def commit(self, transaction: list[str]) -> None:
        self._step("commit")

    def abort(self, transaction: list[str]) -> None:
        self._step("abort")


CONTEXT = TransactionContext("recorder", 7, None)


def test_template_runs_the_steps_in_flinks_order() -> None:
    sink = Recorder()
    assert sink.write(CONTEXT, [Row(a=1)]) is WriteOutcome.COMMITTED
    assert sink.calls == ["is_committed", "begin_transaction", "invoke", "pre_commit", "commit"]


def test_template_skips_a_committed_context() -> None:
    sink = Recorder(committed=True)
    assert sink.write(CONTEXT, [Row(a=1)]) is WriteOutcome.SKIPPED
    assert sink.calls == ["is_committed"]


@pytest.mark.parametrize("step", ["invoke", "pre_commit", "commit"])
def test_template_aborts_on_failure_and_reraises(step: str) -> None:
    sink = Recorder(fail=step)
    with pytest.raises(RuntimeError, match=f"{step} failed"):
        sink.write(CONTEXT, [Row(a=1)])
    assert sink.calls[-2:] == [step, "abort"]


def test_a_failing_abort_is_logged_and_the_first_failure_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class AbortFails(Recorder):
        def abort(self, transaction: list[str]) -> None:
            raise OSError("abort failed as well")

    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="invoke failed"):
        AbortFails(fail="invoke").write(CONTEXT, [])
    assert "sink recorder batch 7: abort failed too" in caplog.text


@pytest.mark.parametrize("step", ["begin_transaction", "invoke", "pre_commit"])
def test_a_race_found_inside_the_transaction_is_a_skip(step: str) -> None:
    sink = Recorder(fail=f"{step}:raced")
    assert sink.write(CONTEXT, []) is WriteOutcome.SKIPPED
    assert "commit" not in sink.calls
    assert sink.calls[-1] == ("abort" if step != "begin_transaction" else step)


def test_file_sink_replay_of_a_committed_batch_is_skipped(tmp_path: Path) -> None:
    sink = JsonFileSink(tmp_path, TransactionScope.BATCH)
    context = TransactionContext("q", 0, None)
    assert sink.write(context, [Row(id=1, word="a")]) is WriteOutcome.COMMITTED
    assert sink.write(context, [Row(id=1, word="changed")]) is WriteOutcome.SKIPPED
    assert sink.final_path(context).read_text() == '{"id": 1, "word": "a"}\n'


# ---------------------------------------------------------------------------------------------
# Real streaming queries, both scopes


@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: s.value)
@pytest.mark.parametrize("step", ["invoke", "pre_commit"])
def test_failure_aborts_and_the_retry_writes_once(
    spark: SparkSession, tmp_path: Path, scope: TransactionScope, step: str
) -> None:
    data = inputs(3)
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add_all(data)
    sink = InstrumentedFileSink(tmp_path, scope)
    sink.fail_once(step, 1)
    checkpoint = tmp_path / "checkpoint"

    failure = run(spark, source.read_stream(spark), sink, checkpoint)
    assert failure is not None and f"injected failure in {step} of batch 1" in str(failure)
    assert sorted(sink.committed_rows()) == [0]  # nothing of batch 1 is visible ...
    assert sink.leftovers() == []  # ... and abort removed its staging file

    assert run(spark, source.read_stream(spark), sink, checkpoint) is None
    committed = sink.committed_rows()
    assert committed == {b: sorted(rows, key=json.dumps) for b, rows in enumerate(data)}
    assert sink.leftovers() == []


@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: s.value)
def test_commit_then_crash_before_sparks_commit_log_is_skipped_on_replay(
    spark: SparkSession, tmp_path: Path, scope: TransactionScope
) -> None:
    """A stateful query (a running count per word, two shuffle partitions): the replayed batch
    writes nothing, yet its state is committed (the sink drains the skipped batch's plan)."""
    data = inputs(4)
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add_all(data)
    sink = InstrumentedFileSink(tmp_path, scope)
    checkpoint = tmp_path / "checkpoint"

    def counts() -> DataFrame:
        return source.read_stream(spark).groupBy("word").agg(F.count("*").alias("n"))

    failure = run(spark, counts(), FailAfterCommit(sink, {2}), checkpoint, "update")
    assert failure is not None and "after the sink committed batch 2" in str(failure)
    assert committed_batches(checkpoint) == [0, 1]
    assert sorted(sink.committed_rows()) == [0, 1, 2]

    assert run(spark, counts(), sink, checkpoint, "update") is None
    expected: dict[int, list[dict[str, Any]]] = {}
    running: dict[str, int] = {}
    for b, rows in enumerate(data):
        for row in rows:
            running[row["word"]] = running.get(row["word"], 0) + 1
        touched = {row["word"] for row in rows}
        expected[b] = sorted(({"word": w, "n": running[w]} for w in touched), key=json.dumps)
    assert sink.committed_rows() == expected
    skipped = [b for b, outcome in sink.outcomes() if outcome == "skipped"]
    assert skipped and set(skipped) == {2}  # one skip per transaction of batch 2
