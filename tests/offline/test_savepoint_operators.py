"""Every operator type keyedstate serves, through a savepoint: Spark's aggregation,
dropDuplicates, applyInPandasWithState, session window and stream-stream join, and two chained
keyed functions with value, list and map state, event-time timers and operator state. Each query
runs its first files, stops, is saved (canonical: every table through Parquet; native), restored
on another path at another partition count, and runs the rest: its output after the
savepoint's batch equals the output of the query restarted on its own checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from tests.offline.test_savepoints import normalized
from tests.offline.test_state_reader import (
    EVENTS,
    FILES,
    LEDGER_FILES,
    LEDGER_INPUT,
    RIGHT_FILES,
    aggregation,
    deduplication,
    join,
    ledger_query,
    pandas_state,
    sessions,
)
from tests.support.state_api_support import ship_by_value
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    committed_batches,
    start_query,
)

ship_by_value(__name__)

Build = Callable[[Mapping[str, DataFrame]], DataFrame]
Inputs = Mapping[str, StructType]
Files = dict[str, list[list[dict[str, Any]]]]


class Lines:
    """A query over its own input directories (one file per micro-batch per input), run phase
    by phase into one collector."""

    def __init__(
        self, spark: SparkSession, root: Path, inputs: Inputs, build: Build, mode: str
    ) -> None:
        self.spark, self.build, self.mode = spark, build, mode
        self.sources = {name: FileInput(root / "input" / name, s) for name, s in inputs.items()}
        self.collector = BatchCollector()

    def run(self, checkpoint: Path, files: Files) -> None:
        for name, rows in files.items():
            self.sources[name].add_all(rows)
        frames = {name: source.read_stream(self.spark) for name, source in self.sources.items()}
        frame = self.build(frames)
        query = start_query(
            self.spark, PROVIDER_UNDER_TEST, frame, self.mode, checkpoint, self.collector
        )
        await_finished(query)


EVENTS_ONLY: Inputs = {"events": EVENTS}
SCENARIOS: dict[str, tuple[Build, str, Inputs, Files]] = {
    "aggregation": (aggregation, "update", EVENTS_ONLY, {"events": FILES}),
    "dedup": (deduplication, "append", EVENTS_ONLY, {"events": FILES}),
    "pandas": (pandas_state, "update", EVENTS_ONLY, {"events": FILES}),
    "sessions": (sessions, "append", EVENTS_ONLY, {"events": FILES}),
    "join": (
        join,
        "append",
        {"left": EVENTS, "right": EVENTS},
        {"left": FILES, "right": RIGHT_FILES},
    ),
    "keyed-functions": (ledger_query, "append", {"events": LEDGER_INPUT}, {"events": LEDGER_FILES}),
}


@pytest.mark.parametrize(
    ("scenario", "fmt"),
    [(name, "canonical") for name in SCENARIOS] + [("keyed-functions", "native")],
)
def test_every_operator_continues_through_a_savepoint_at_another_partition_count(
    spark: SparkSession, tmp_path: Path, scenario: str, fmt: str
) -> None:
    build, mode, inputs, files = SCENARIOS[scenario]
    cut = len(next(iter(files.values()))) // 2
    first = {name: rows[:cut] for name, rows in files.items()}
    rest = {name: rows[cut:] for name, rows in files.items()}
    # The uninterrupted query stops and restarts at the same place (a restart may run a batch
    # that only moves the watermark on): only the savepoint differs.
    reference = Lines(spark, tmp_path / "reference", inputs, build, mode)
    for phase in (first, rest):
        reference.run(tmp_path / "reference" / "checkpoint", phase)

    line = Lines(spark, tmp_path / "line", inputs, build, mode)
    original = tmp_path / "line" / "checkpoint"
    line.run(original, first)
    batch = committed_batches(original)[-1]
    target = tmp_path / "savepoint"
    info = keyedstate.savepoint(spark, str(original), str(target), format=fmt)
    assert info.batch_id == batch
    if fmt == "canonical":
        assert all(sum(t.rows for t in o.tables) > 0 for o in info.operators), info.operators
    restored = tmp_path / "restored"
    keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=3)
    line.run(restored, rest)
    got = normalized(line.collector.batches, batch)
    assert got, "the restored query wrote nothing"
    assert got == normalized(reference.collector.batches, batch)
