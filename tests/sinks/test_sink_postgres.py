"""The exactly-once PostgreSQL sink on a real server (tests/support/servers/postgres_server.py)
with real streaming queries: append and upsert across a failure after the database commit but
before Spark's commit log, a failure mid-write, bad settings, and the database killed
mid-batch."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate.sinks import (
    PostgresSink,
    PostgresSinkError,
    TransactionContext,
    WriteOutcome,
    postgres,
)
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.sinks.sink_support import FailAfterCommit, run
from tests.support.servers.postgres_server import PostgresServer
from tests.support.streaming_harness import FileInput, committed_batches

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("word", T.StringType()),
        T.StructField("n", T.LongType()),
    ]
)
WORDS = ["apple", "pear", "fig", "kiwi", "plum"]
_tables = itertools.count()


def batches(count: int, rows_per_batch: int = 40) -> list[list[dict[str, Any]]]:
    """Deterministic input: ids unique across batches (so a duplicate append is visible)."""
    return [
        [
            {"id": b * 1000 + i, "word": WORDS[(b * 7 + i) % len(WORDS)], "n": (b + 1) * (i + 1)}
            for i in range(rows_per_batch)
        ]
        for b in range(count)
    ]


def expected_totals(inputs: list[list[dict[str, Any]]]) -> list[tuple[str, int, int]]:
    totals: dict[str, list[int]] = {}
    for rows in inputs:
        for row in rows:
            entry = totals.setdefault(row["word"], [0, 0])
            entry[0] += row["n"]
            entry[1] += 1
    return sorted((word, total, count) for word, (total, count) in totals.items())


@pytest.fixture
def table(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh table name; dropped after the test."""
    name = f"sink_test_{next(_tables)}"
    yield name
    postgres_server.execute(f"DROP TABLE IF EXISTS {name}")


def create_events_table(server: PostgresServer, name: str) -> None:
    server.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, word text NOT NULL, n bigint)")


def create_totals_table(server: PostgresServer, name: str) -> None:
    server.execute(f"CREATE TABLE {name} (word text PRIMARY KEY, total bigint, cnt bigint)")


def input_of(tmp_path: Path, inputs: list[list[dict[str, Any]]]) -> FileInput:
    """``inputs`` written as the query's input files, one a batch."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add_all(inputs)
    return source


def events_run(
    server: PostgresServer, table: str, tmp_path: Path, inputs: list[list[dict[str, Any]]]
) -> tuple[FileInput, RecordingSink]:
    """The events table, ``inputs`` as the query's input, and a recording sink on the table."""
    create_events_table(server, table)
    return input_of(tmp_path, inputs), recording(postgres(table, **server.params()))


class RecordingSink(PostgresSink):
    """The real sink, recording each transaction's outcome and able to fail on cue."""

    outcomes: list[tuple[int, WriteOutcome]]
    fail_mid_copy: set[int]  # batches whose row stream breaks half-way (once each)
    kill_mid_copy: dict[int, PostgresServer]  # batches during whose COPY the server is killed

    def write(self, context: TransactionContext, rows: Iterable[Row]) -> WriteOutcome:
        outcome = super().write(context, self._disturbed(context.batch_id, rows))
        self.outcomes.append((context.batch_id, outcome))
        return outcome

    def _disturbed(self, batch_id: int, rows: Iterable[Row]) -> Iterator[Row]:
        for index, row in enumerate(rows):
            if index == 10 and batch_id in self.fail_mid_copy:
                self.fail_mid_copy.discard(batch_id)
                raise RuntimeError(f"injected failure mid-write of batch {batch_id}")
            if index == 10 and batch_id in self.kill_mid_copy:
                self.kill_mid_copy.pop(batch_id).kill()
            yield row


def recording(sink: PostgresSink) -> RecordingSink:
    sink.__class__ = RecordingSink
    assert isinstance(sink, RecordingSink)
    sink.outcomes, sink.fail_mid_copy, sink.kill_mid_copy = [], set(), {}
    return sink


def rows(server: PostgresServer, statement: str) -> list[tuple[Any, ...]]:
    return sorted(server.execute(statement))


def events_of(inputs: list[list[dict[str, Any]]]) -> list[tuple[int, str, int]]:
    return sorted((r["id"], r["word"], r["n"]) for batch in inputs for r in batch)


# ---------------------------------------------------------------------------------------------
# Exactly once across failures


def test_append_exactly_once_across_failure_after_db_commit(
    spark: SparkSession, postgres_server: PostgresServer, table: str, tmp_path: Path
) -> None:
    inputs = batches(4)
    source, sink = events_run(postgres_server, table, tmp_path, inputs)
    checkpoint = tmp_path / "checkpoint"

    fail_once = FailAfterCommit(sink, {1}, "the database")
    failure = run(spark, source.read_stream(spark), fail_once, checkpoint)
    assert failure is not None and "after the database committed batch 1" in str(failure)
    assert committed_batches(checkpoint) == [0]  # Spark's commit log misses batch 1 ...
    assert len(rows(postgres_server, f"SELECT id FROM {table}")) == 80  # ... the table has it

    assert run(spark, source.read_stream(spark), sink, checkpoint) is None
    assert rows(postgres_server, f"SELECT id, word, n FROM {table}") == events_of(inputs)
    assert sink.outcomes == [
        (0, WriteOutcome.COMMITTED),
        (1, WriteOutcome.COMMITTED),
        (1, WriteOutcome.SKIPPED),  # the replay after the restart
        (2, WriteOutcome.COMMITTED),
        (3, WriteOutcome.COMMITTED),
    ]
    progress = rows(
        postgres_server,
        f"SELECT batch_id, row_count FROM keyedstate_sink_progress WHERE target_table = "
        f"'public.{table}'",
    )
    assert progress == [(0, 40), (1, 40), (2, 40), (3, 40)]


def test_upsert_exactly_once_across_failure_after_db_commit(
    spark: SparkSession, postgres_server: PostgresServer, table: str, tmp_path: Path
) -> None:
    create_totals_table(postgres_server, table)
    inputs = batches(3)
    source = input_of(tmp_path, inputs)
    sink = recording(
        postgres(table, mode="upsert", key_columns=["word"], **postgres_server.params())
    )
    checkpoint = tmp_path / "checkpoint"

    def totals(df: DataFrame) -> DataFrame:
        return df.groupBy("word").agg(F.sum("n").alias("total"), F.count("*").alias("cnt"))

    fail_once = FailAfterCommit(sink, {1}, "the database")
    failure = run(spark, totals(source.read_stream(spark)), fail_once, checkpoint, "update")
    assert failure is not None
    assert run(spark, totals(source.read_stream(spark)), sink, checkpoint, "update") is None
    assert rows(postgres_server, f"SELECT word, total, cnt FROM {table}") == expected_totals(inputs)
    assert [b for b, outcome in sink.outcomes if outcome is WriteOutcome.SKIPPED] == [1]


def test_failure_mid_write_leaves_nothing_and_the_retry_writes_once(
    spark: SparkSession, postgres_server: PostgresServer, table: str, tmp_path: Path
) -> None:
    inputs = batches(3)
    source, sink = events_run(postgres_server, table, tmp_path, inputs)
    sink.fail_mid_copy.add(1)
    checkpoint = tmp_path / "checkpoint"

    failure = run(spark, source.read_stream(spark), sink, checkpoint)
    assert failure is not None and "injected failure mid-write of batch 1" in str(failure)
    # Ten rows of batch 1 had reached the database: rolled back with the batch.
    assert rows(postgres_server, f"SELECT id, word, n FROM {table}") == events_of(inputs[:1])

    assert run(spark, source.read_stream(spark), sink, checkpoint) is None
    assert rows(postgres_server, f"SELECT id, word, n FROM {table}") == events_of(inputs)


def test_a_task_failing_mid_copy_fails_the_batch_with_its_own_error(
    spark: SparkSession,
    postgres_server: PostgresServer,
    table: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task of the batch's plan fails while its rows stream into COPY. Spark's error quotes
    executor stack traces, far over the 10,000 bytes PostgreSQL takes as COPY's failure message
    (psycopg sends the exception's text): the COPY must still end cleanly (no "error ignored
    terminating" warning from psycopg, no connection dropped by the server), the batch fail
    with the task's error, nothing of it be written, and the retry write it once."""
    create_events_table(postgres_server, table)
    inputs = batches(2)
    source = input_of(tmp_path, inputs)
    marker = tmp_path / "fail-once"
    marker.touch()
    fail_at = inputs[1][10]["id"]

    @F.udf(returnType="long", useArrow=False)  # a plain Python UDF, no type-hint inference
    def n_or_fail(row_id: int, n: int) -> int:
        import os

        if row_id == fail_at and os.path.exists(marker):
            os.remove(marker)
            raise ValueError(f"injected task failure at id {row_id}")
        return n

    def stream() -> DataFrame:
        return source.read_stream(spark).withColumn("n", n_or_fail("id", "n"))

    sink = postgres(table, **postgres_server.params())
    checkpoint = tmp_path / "checkpoint"
    logged = len(postgres_server.log_path.read_text(errors="replace"))
    with caplog.at_level(logging.WARNING, logger="psycopg"):
        failure = run(spark, stream(), sink, checkpoint)
    assert failure is not None and f"injected task failure at id {fail_at}" in str(failure)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    server_log = postgres_server.log_path.read_text(errors="replace")[logged:]
    assert "protocol synchronization was lost" not in server_log, server_log
    assert rows(postgres_server, f"SELECT id, word, n FROM {table}") == events_of(inputs[:1])

    assert run(spark, stream(), sink, checkpoint) is None
    assert rows(postgres_server, f"SELECT id, word, n FROM {table}") == events_of(inputs)


def test_database_killed_mid_batch_then_restarted(
    spark: SparkSession, postgres_server: PostgresServer, table: str, tmp_path: Path
) -> None:
    inputs = batches(4)
    source, sink = events_run(postgres_server, table, tmp_path, inputs)
    sink.kill_mid_copy[2] = postgres_server
    checkpoint = tmp_path / "checkpoint"
    try:
        failure = run(spark, source.read_stream(spark), sink, checkpoint)
    finally:
        postgres_server.start()  # same port and data directory
    assert failure is not None
    message = str(failure)
    assert f"lost the connection to PostgreSQL 127.0.0.1:{postgres_server.port}" in message
    assert "batch 2 of sink" in message and table in message

    assert run(spark, source.read_stream(spark), sink, checkpoint) is None
    # Exactly what an uninterrupted run writes: every event once.
    assert rows(postgres_server, f"SELECT id, word, n FROM {table}") == events_of(inputs)


def test_user_sink_id_and_a_reset_checkpoint_is_refused(
    spark: SparkSession, postgres_server: PostgresServer, table: str, tmp_path: Path
) -> None:
    create_events_table(postgres_server, table)
    inputs = batches(2, rows_per_batch=5)
    source = input_of(tmp_path, inputs)
    name = f"orders-{table}"
    sink = postgres(table, sink_id=name, **postgres_server.params())
    assert run(spark, source.read_stream(spark), sink, tmp_path / "first") is None
    # A new checkpoint replays batch 0 under the same sink id: never silently skipped.
    failure = run(spark, source.read_stream(spark), sink, tmp_path / "second")
    assert failure is not None and f"postgres sink {name}: the query replays batch 0" in str(
        failure
    )
    assert "has batch 1 committed" in str(failure)
    # Raised in the foreachBatch function, it reached Spark as text: found, as its class.
    error = keyedstate.state_error(failure)
    assert isinstance(error, PostgresSinkError), str(failure)[:3000]
    assert str(error).startswith(f"postgres sink {name}: the query replays batch 0 but ")
    assert error.error_id is None
    assert rows(postgres_server, f"SELECT id, word, n FROM {table}") == events_of(inputs)
    postgres_server.execute(f"DELETE FROM keyedstate_sink_progress WHERE sink_id = '{name}'")


# ---------------------------------------------------------------------------------------------
# Bad settings: clear errors before any batch


def test_unreachable_server_names_host_and_port() -> None:
    from tests.support.servers.ports import free_port

    port = free_port()
    with pytest.raises(PostgresSinkError, match=rf"server 127\.0\.0\.1:{port} is unreachable"):
        postgres("t", host="127.0.0.1", port=port, password="x", connect_timeout_s=2)


def test_wrong_credentials_name_user_and_database(postgres_server: PostgresServer) -> None:
    params = postgres_server.params(password="wrong")
    with pytest.raises(PostgresSinkError, match="refused user 'postgres' on database 'postgres'"):
        postgres("t", **params)
    with pytest.raises(PostgresSinkError, match="refused user 'nobody'"):
        postgres("t", **postgres_server.params(user="nobody"))
    with pytest.raises(PostgresSinkError, match="no database 'absent'.*CREATE DATABASE"):
        postgres("t", **postgres_server.params(dbname="absent"))


def test_missing_table_names_it_and_the_fix(postgres_server: PostgresServer) -> None:
    with pytest.raises(PostgresSinkError, match="table 'no_such_table' does not exist.*CREATE"):
        postgres("no_such_table", **postgres_server.params())


def test_columns_not_matching_the_dataframe(
    spark: SparkSession, postgres_server: PostgresServer, table: str
) -> None:
    postgres_server.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, word integer, extra text NOT NULL)"
    )
    sink = postgres(table, **postgres_server.params())
    df = spark.createDataFrame([], SCHEMA)
    with pytest.raises(PostgresSinkError) as failure:
        sink.check(df)
    message = str(failure.value)
    assert f"table public.{table} on 127.0.0.1:{postgres_server.port} does not match" in message
    assert "not in the table: n" in message
    assert "missing in the DataFrame: extra" in message
    assert "word is string in the DataFrame but integer in the table" in message
    assert "DataFrame: (id bigint, word string, n bigint)" in message
    assert "table: (id bigint, word integer, extra text)" in message
    assert f"Fix: ALTER TABLE public.{table} ADD COLUMN n bigint" in message


def test_upsert_key_columns_checked(postgres_server: PostgresServer, table: str) -> None:
    create_totals_table(postgres_server, table)
    params = postgres_server.params()
    with pytest.raises(PostgresSinkError, match=r"key column\(s\) wrd not in table"):
        postgres(table, mode="upsert", key_columns=["wrd"], **params)
    with pytest.raises(PostgresSinkError, match=r"no unique index or primary key on exactly"):
        postgres(table, mode="upsert", key_columns=["word", "cnt"], **params)
    with pytest.raises(ValueError, match="needs key_columns"):
        postgres(table, mode="upsert", **params)
    with pytest.raises(ValueError, match="mode must be"):
        postgres(table, mode="merge", **params)  # type: ignore[arg-type]


def test_column_types_round_trip(
    spark: SparkSession, postgres_server: PostgresServer, table: str
) -> None:
    """Spark's types reach their PostgreSQL columns unchanged (a batch written as foreachBatch
    would: the sink called with the batch DataFrame and its id)."""
    import datetime as dt
    import decimal

    postgres_server.execute(
        f"CREATE TABLE {table} (id integer, name text, price numeric(10, 2), ratio double "
        "precision, ok boolean, day date, at timestamptz, local_at timestamp, tags text[], "
        "attrs jsonb, blob bytea)"
    )
    at = dt.datetime(2024, 3, 1, 12, 30, 5, 123456, tzinfo=dt.timezone.utc)
    row = (
        1,
        "naïve 'quoted' \t\\ text",
        decimal.Decimal("12.34"),
        0.5,
        True,
        dt.date(2024, 2, 29),
        at,
        dt.datetime(2024, 3, 1, 8, 0),
        ["a", "b"],
        {"k": 1},
        b"\x00\x01",
    )
    schema = (
        "id int, name string, price decimal(10,2), ratio double, ok boolean, day date, "
        "at timestamp, local_at timestamp_ntz, tags array<string>, attrs map<string,int>, "
        "blob binary"
    )
    df = spark.createDataFrame([row, (2,) + (None,) * 10], schema)
    postgres(table, sink_id=f"types-{table}", **postgres_server.params())(df, 0)
    got = postgres_server.execute(f"SELECT * FROM {table} ORDER BY id")
    assert got[0] == row[:6] + (at, row[7], ["a", "b"], {"k": 1}, b"\x00\x01")
    assert got[1] == (2,) + (None,) * 10
    postgres_server.execute(f"DELETE FROM keyedstate_sink_progress WHERE sink_id = 'types-{table}'")
