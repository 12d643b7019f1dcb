"""The exactly-once sinks from a Spark Connect client (docs/spark-connect.md): ``foreachBatch``
runs in the Connect server's Python process with a Connect DataFrame. The PostgreSQL sink writes
there; the Kafka sink hands the batch to the server's ``sink.kafka.write`` operation. A batch that
fails after the sink committed it is replayed by the restarted query and written once; a sink
without a ``sink_id`` is refused by name (the query's id is not visible to foreachBatch there)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from keyedstate import sinks

from tests.sinks.sink_support import FailAfterCommit, run
from tests.sinks.test_sink_kafka import INPUT_SCHEMA, committed, new_topic
from tests.sinks.test_sink_postgres import SCHEMA, batches, create_events_table, events_of, rows
from tests.support.servers.kafka_broker import KafkaBroker
from tests.support.servers.postgres_server import PostgresServer
from tests.support.streaming_harness import FileInput, committed_batches


@pytest.fixture
def events_table(postgres_server: PostgresServer) -> Iterator[str]:
    name = f"connect_sink_{uuid.uuid4().hex[:8]}"
    create_events_table(postgres_server, name)
    yield name
    postgres_server.execute(f"DROP TABLE IF EXISTS {name}")


def test_the_postgres_sink_from_a_connect_client_writes_each_batch_once(
    connect_spark: Any,  # noqa: ANN401 - a Connect SparkSession
    postgres_server: PostgresServer,
    events_table: str,
    tmp_path: Path,
) -> None:
    inputs = batches(3)
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add_all(inputs)
    checkpoint = tmp_path / "checkpoint"
    sink = sinks.postgres(
        events_table, sink_id=f"connect-{events_table}", **postgres_server.params()
    )

    failing = FailAfterCommit(sink, {1}, "the database")
    failure = run(connect_spark, source.read_stream(connect_spark), failing, checkpoint)
    assert failure is not None and "after the database committed batch 1" in str(failure)
    assert committed_batches(checkpoint) == [0]  # Spark's commit log misses batch 1 ...
    assert len(rows(postgres_server, f"SELECT id FROM {events_table}")) == 80  # ... the table not

    assert run(connect_spark, source.read_stream(connect_spark), sink, checkpoint) is None
    assert rows(postgres_server, f"SELECT id, word, n FROM {events_table}") == events_of(inputs)
    progress = rows(
        postgres_server,
        "SELECT batch_id, row_count FROM keyedstate_sink_progress WHERE target_table = "
        f"'public.{events_table}'",
    )
    assert progress == [(0, 40), (1, 40), (2, 40)]


def test_a_sink_without_a_sink_id_is_refused_on_connect_naming_the_fix(
    connect_spark: Any,  # noqa: ANN401 - a Connect SparkSession
    postgres_server: PostgresServer,
    events_table: str,
    tmp_path: Path,
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add_all(batches(1))
    sink = sinks.postgres(events_table, **postgres_server.params())
    failure = run(connect_spark, source.read_stream(connect_spark), sink, tmp_path / "checkpoint")
    assert failure is not None
    assert "on Spark Connect give the sink a stable sink_id" in str(failure), failure
    assert rows(postgres_server, f"SELECT id FROM {events_table}") == []


def test_the_kafka_sink_from_a_connect_client_writes_each_record_once(
    connect_spark: Any,  # noqa: ANN401 - a Connect SparkSession
    kafka_broker: KafkaBroker,
    tmp_path: Path,
) -> None:
    topic = new_topic(kafka_broker)
    source = FileInput(tmp_path / "input", INPUT_SCHEMA)
    inputs = [[{"id": b * 10 + i, "payload": f"p{b}-{i}"} for i in range(6)] for b in range(3)]
    source.add_all(inputs)
    checkpoint = tmp_path / "checkpoint"
    sink = sinks.kafka(topic, kafka_broker.bootstrap_servers, sink_id=f"connect-{topic}")

    def stream() -> Any:  # noqa: ANN401 - a Connect DataFrame
        frame = source.read_stream(connect_spark)
        return frame.selectExpr("CAST(id AS STRING) AS key", "payload AS value").repartition(
            2, "key"
        )

    failure = run(connect_spark, stream(), FailAfterCommit(sink, {1}), checkpoint)
    assert failure is not None and "after the sink committed batch 1" in str(failure)
    assert committed_batches(checkpoint) == [0]
    assert run(connect_spark, stream(), sink, checkpoint) is None

    expected = sorted((str(r["id"]), str(r["payload"])) for b in inputs for r in b)
    assert committed(kafka_broker, topic) == expected  # batch 1 replayed, its records once
