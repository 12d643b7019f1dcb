"""Bootstrapping (Flink's ``OperatorTransformation.bootstrapWith``): a new query started from a
savepoint bootstrapped from historical data gives the same output as a query that processed the
historical data as a stream, for a keyed function and a Spark aggregation; a query that would
read the bootstrapped state at another partition count is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from pyspark.errors import IllegalArgumentException, StreamingQueryException
from pyspark.sql import SparkSession

from tests.offline.test_savepoints import PHASES, SCHEMA, Build, Line, counts, tally
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    await_finished,
    start_query,
)


def outputs(batches: dict[int, list[dict[str, Any]]], from_batch: int) -> list[str]:
    """Every row written from batch ``from_batch`` on: the batch ids of the two runs differ."""
    return sorted(
        json.dumps(row, sort_keys=True)
        for batch, rows in batches.items()
        if batch >= from_batch
        for row in rows
    )


@pytest.mark.parametrize(
    ("build", "mode"),
    [(tally, "append"), (counts, "update")],
    ids=["keyed-function", "aggregation"],
)
def test_a_bootstrapped_query_continues_as_the_streamed_history(
    spark: SparkSession, tmp_path: Path, build: Build, mode: str
) -> None:
    history, recent = PHASES
    streamed = Line(spark, tmp_path / "streamed", build, mode)
    streamed.run(tmp_path / "streamed" / "checkpoint", history)
    first_recent = len(streamed.collector.batches)
    streamed.run(tmp_path / "streamed" / "checkpoint", recent)

    # One input file keeps each key's rows in the order the stream saw them.
    data = spark.createDataFrame([row for rows in history for row in rows], SCHEMA).coalesce(1)
    target = tmp_path / "bootstrapped"
    info = keyedstate.state.bootstrap(spark, data, build, str(target), output_mode=mode)
    assert (info.format, info.batch_id, info.state_version) == ("canonical", -1, 0)
    assert all(t.rows > 0 for o in info.operators for t in o.tables)
    assert not (tmp_path / "bootstrapped.bootstrapping").exists()
    checkpoint = tmp_path / "started"
    keyedstate.restore_savepoint(spark, str(target), str(checkpoint))

    fresh = Line(spark, tmp_path / "fresh", build, mode)
    fresh.run(checkpoint, recent)
    assert outputs(fresh.collector.batches, 0) == outputs(streamed.collector.batches, first_recent)


def test_bootstrapped_state_read_at_another_partition_count_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = spark.createDataFrame([row for rows in PHASES[0] for row in rows], SCHEMA)
    target = tmp_path / "bootstrapped"
    keyedstate.state.bootstrap(spark, data, counts, str(target), output_mode="update")
    checkpoint = tmp_path / "started"
    keyedstate.restore_savepoint(spark, str(target), str(checkpoint), partitions=3)
    fresh = Line(spark, tmp_path / "fresh", counts, "update")
    fresh.source.add_all(PHASES[1])
    collector = BatchCollector()
    # Refused by start(), before the first batch.
    with pytest.raises((IllegalArgumentException, StreamingQueryException)) as failure:
        frame = counts(fresh.source.read_stream(spark))
        query = start_query(spark, PROVIDER_UNDER_TEST, frame, "update", checkpoint, collector)
        await_finished(query)
    error = keyedstate.state_error(failure.value)
    assert error is not None, failure.value
    assert error.error_id == "KEYEDSTATE_QUERY_CHECKPOINT_INVALID", error
    assert "written for 3 partitions and the query would run with 2" in str(error)
    assert collector.batches == {}
