"""A savepoint restored into a changed query (Flink's schema evolution rules): keyed functions get
their state by uid wherever the new query applies them, a new function or state starts empty, a
savepoint's function or state the query no longer has is refused unless the restore allows
non-restored state, and a changed state type is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    key_by,
)
from pyspark.sql import DataFrame, SparkSession

from tests.offline.test_savepoints import (
    OUT,
    PHASES,
    SCHEMA,
    Line,
    checkpoint_format,
    normalized,
    tally,
)
from tests.support.state_api_support import ship_by_value
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    await_finished,
    committed_batches,
    refusal,
    start_query,
)

PASSED = "k string, v long"


class Passing(KeyedProcessFunction):
    """Forwards every element unchanged, counting them per key."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:  # noqa: ANN401
        self.seen.update((self.seen.value() or 0) + 1)
        yield (value.k, value.v)


class Narrower(KeyedProcessFunction):
    """Tally's count and recent values, without its map state (or, ``as_text``, a count kept
    as text: the type of a stored state changed)."""

    def __init__(self, as_text: bool = False) -> None:
        self.as_text = as_text

    def open(self, runtime_context: RuntimeContext) -> None:
        kind = Types.STRING() if self.as_text else Types.LONG()
        self.count = runtime_context.get_state(ValueStateDescriptor("count", kind))
        self.recent = runtime_context.get_list_state(ListStateDescriptor("recent", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:  # noqa: ANN401
        n = int(self.count.value() or 0) + 1
        self.count.update(str(n) if self.as_text else n)
        recent = ([*self.recent.get(), value.v])[-3:]
        self.recent.update(recent)
        yield (value.k, n, sum(recent), 0)


ship_by_value(__name__)


def passing_then_tally(frame: DataFrame) -> DataFrame:
    passed = key_by(frame, "k").process(Passing(), PASSED, uid="pass")
    return tally(passed)


def narrower(frame: DataFrame, as_text: bool = False) -> DataFrame:
    return key_by(frame, "k").process(Narrower(as_text), OUT, uid="tally")


def savepoint_of_phase_one(
    spark: SparkSession, root: Path, build: Any, fmt: str  # noqa: ANN401 - a query builder
) -> tuple[Line, Path, int]:
    """The first phase run and saved; the line's input (which the restored query's file source
    log names) then holds the second phase too."""
    line = Line(spark, root / "first", build, "append")
    checkpoint = root / "first" / "checkpoint"
    line.run(checkpoint, PHASES[0])
    target = root / "savepoint"
    keyedstate.savepoint(spark, str(checkpoint), str(target), format=fmt)
    line.source.add_all(PHASES[1])
    return line, target, committed_batches(checkpoint)[-1]


def run(spark: SparkSession, line: Line, frame: DataFrame, checkpoint: Path) -> None:
    query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, line.collector)
    await_finished(query)


@pytest.fixture
def reference(spark: SparkSession, tmp_path: Path) -> dict[int, list[dict[str, Any]]]:
    """Tally's output, run uninterrupted over both phases."""
    line = Line(spark, tmp_path / "reference", tally, "append")
    for phase in PHASES:
        line.run(tmp_path / "reference" / "checkpoint", phase)
    return line.collector.batches


@pytest.mark.parametrize(
    ("fmt", "checkpoint_version"), [("native", 1), ("canonical", 1), ("native", 2)]
)
def test_a_function_added_before_another_moves_its_state_by_uid(
    spark: SparkSession,
    tmp_path: Path,
    reference: dict[int, list[dict[str, Any]]],
    fmt: str,
    checkpoint_version: int,
) -> None:
    with checkpoint_format(spark, checkpoint_version):
        line, savepoint, batch = savepoint_of_phase_one(spark, tmp_path, tally, fmt)
        restored = tmp_path / "restored"
        keyedstate.restore_savepoint(spark, str(savepoint), str(restored))
        # Passing now runs first: Tally moves from operator 1000 to 1001, Passing starts empty.
        run(spark, line, passing_then_tally(line.source.read_stream(spark)), restored)
    assert normalized(line.collector.batches, batch) == normalized(reference, batch)
    seen = keyedstate.state.read(spark, str(restored), "pass", "seen").drop("partition_id")
    want: dict[str, int] = {}
    for rows in PHASES[1]:
        for row in rows:
            want[row["k"]] = want.get(row["k"], 0) + 1
    assert dict(tuple(r) for r in seen.collect()) == want
    report = keyedstate.inspect(spark, str(restored))
    assert [(o.operator_id, o.uid) for o in report.operators] == [(1000, "pass"), (1001, "tally")]


@pytest.mark.parametrize("fmt", ["native", "canonical"])
def test_a_removed_function_needs_allow_non_restored_state(
    spark: SparkSession, tmp_path: Path, reference: dict[int, list[dict[str, Any]]], fmt: str
) -> None:
    line, savepoint, batch = savepoint_of_phase_one(spark, tmp_path, passing_then_tally, fmt)
    strict = tmp_path / "strict"
    keyedstate.restore_savepoint(spark, str(savepoint), str(strict))
    error = refusal(spark, tally(line.source.read_stream(spark)), strict)
    assert error.error_id == "KEYED_FUNCTION_STATE_NOT_RESTORED", error
    assert "keyed function Passing (uid 'pass') (operator 1000 there)" in str(error), error
    assert "allow_non_restored_state" in str(error)

    allowed = tmp_path / "allowed"
    keyedstate.restore_savepoint(
        spark, str(savepoint), str(allowed), allow_non_restored_state=True
    )
    run(spark, line, tally(line.source.read_stream(spark)), allowed)
    # Tally moved from 1001 to 1000 and went on as the uninterrupted Tally.
    assert normalized(line.collector.batches, batch) == normalized(reference, batch)
    assert not (allowed / "state" / "1001").exists()


def test_a_removed_state_needs_allow_and_a_changed_type_is_refusal(
    spark: SparkSession, tmp_path: Path
) -> None:
    line, savepoint, _ = savepoint_of_phase_one(spark, tmp_path, tally, "native")
    source = line.source

    strict = tmp_path / "strict"
    keyedstate.restore_savepoint(spark, str(savepoint), str(strict))
    error = refusal(spark, narrower(source.read_stream(spark)), strict)
    assert error.error_id == "KEYED_FUNCTION_STATE_NOT_RESTORED", error
    assert "state 'parity' of keyed function Tally (uid 'tally')" in str(error)

    text = tmp_path / "text"
    keyedstate.restore_savepoint(spark, str(savepoint), str(text), allow_non_restored_state=True)
    error = refusal(spark, narrower(source.read_stream(spark), as_text=True), text)
    assert error.error_id == "KEYED_FUNCTION_STATE_CHANGED", error
    assert "state 'count'" in str(error)

    allowed = tmp_path / "allowed"
    keyedstate.restore_savepoint(spark, str(savepoint), str(allowed), allow_non_restored_state=True)
    run(spark, line, narrower(source.read_stream(spark)), allowed)
    # The counts went on from the savepoint's.
    before = keyedstate.state.read(spark, str(savepoint), "tally", "count").drop("partition_id")
    after = keyedstate.state.read(spark, str(allowed), "tally", "count").drop("partition_id")
    counted = dict(tuple(r) for r in before.collect())
    for rows in PHASES[1]:
        for row in rows:
            counted[row["k"]] = counted.get(row["k"], 0) + 1
    assert dict(tuple(r) for r in after.collect()) == counted


def passing(frame: DataFrame) -> DataFrame:
    return key_by(frame, "k").process(Passing(), PASSED, uid="pass")


def test_a_keyed_function_added_by_a_transform_starts_with_its_bootstrapped_state(
    spark: SparkSession, tmp_path: Path, reference: dict[int, list[dict[str, Any]]]
) -> None:
    """Flink's ``SavepointWriter.withOperator``: a function bootstrapped from history is added to
    a running query's savepoint; the query restored from it, now with that function before the
    saved one, finds both states by uid (they swap operator ids)."""
    line, source, batch = savepoint_of_phase_one(spark, tmp_path, tally, "native")
    history = spark.createDataFrame([r for rows in PHASES[0] for r in rows], SCHEMA).coalesce(1)
    bootstrapped = tmp_path / "pass-bootstrapped"
    keyedstate.state.bootstrap(spark, history, passing, str(bootstrapped))
    target = tmp_path / "with-pass"
    transform = keyedstate.state.transform
    info = transform(spark, str(source), str(target), add={"pass": str(bootstrapped)})
    assert [(o.operator_id, o.uid) for o in info.operators] == [(1000, "tally"), (1001, "pass")]
    assert info.batch_id == batch
    with pytest.raises(keyedstate.QueryCheckpointError, match="without a uid"):
        transform(spark, str(source), str(tmp_path / "z"), add={"": str(target)})
    with pytest.raises(keyedstate.QueryCheckpointError, match="already has one"):
        transform(spark, str(source), str(tmp_path / "x"), add={"tally": str(target)})
    with pytest.raises(keyedstate.QueryCheckpointError, match="no keyed function with uid 'led"):
        transform(spark, str(source), str(tmp_path / "y"), add={"ledger": str(target)})

    restored = tmp_path / "restored"
    keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=3)
    run(spark, line, passing_then_tally(line.source.read_stream(spark)), restored)
    assert normalized(line.collector.batches, batch) == normalized(reference, batch)
    seen = keyedstate.state.read(spark, str(restored), "pass", "seen").drop("partition_id")
    want: dict[str, int] = {}
    for phase in PHASES:
        for rows in phase:
            for row in rows:
                want[row["k"]] = want.get(row["k"], 0) + 1
    assert dict(tuple(r) for r in seen.collect()) == want
