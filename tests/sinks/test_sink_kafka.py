"""keyedstate.sinks.kafka against a real broker: what a read_committed reader sees is each record
exactly once, whatever is replayed, aborted or left behind by a zombie attempt; bad input fails
fast and names the problem."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from keyedstate import sinks
from keyedstate.sinks.kafka import KafkaSink, KafkaSinkError, KafkaTransaction, jvm_error
from keyedstate.sinks.two_phase_commit import (
    BatchAlreadyCommitted,
    TransactionContext,
    WriteOutcome,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.servers.kafka_broker import KafkaBroker, free_port
from tests.support.streaming_harness import QUERY_TIMEOUT_S, FileInput

INPUT_SCHEMA = StructType([StructField("id", LongType()), StructField("payload", StringType())])


def new_topic(broker: KafkaBroker, partitions: int = 2) -> str:
    return broker.create_topic(f"sink-{uuid.uuid4().hex[:10]}", partitions=partitions)


def records(start: int, count: int) -> list[tuple[str, str]]:
    return [(f"k{i}", f"v{i}") for i in range(start, start + count)]


def frame(spark: SparkSession, rows: list[tuple[str, str]], partitions: int = 2) -> DataFrame:
    return spark.createDataFrame(rows, "key string, value string").repartition(partitions, "key")


def committed(broker: KafkaBroker, topic: str) -> list[tuple[str, str]]:
    """What a read_committed reader sees, sorted, as text."""
    return sorted(
        (key.decode(), value.decode())
        for _, key, value in broker.read(topic, "read_committed")
        if key is not None and value is not None
    )


def ctx(sink_id: str, batch_id: int, partition_id: int | None = 0) -> TransactionContext:
    return TransactionContext(sink_id, batch_id, partition_id)


def as_rows(pairs: list[tuple[str, str]]) -> list[Row]:
    return [Row(key=k, value=v) for k, v in pairs]


def topic_and_sink(broker: KafkaBroker) -> tuple[str, KafkaSink]:
    """A new one-partition topic, and a sink on it named after it."""
    topic = new_topic(broker, partitions=1)
    return topic, sinks.kafka(topic, broker.bootstrap_servers, sink_id=topic)


def prepared(sink: KafkaSink, context: TransactionContext, rows: list[Row]) -> KafkaTransaction:
    """An attempt's transaction with ``rows`` sent and flushed (pre-committed), not committed."""
    transaction = sink.begin_transaction(context)
    sink.invoke(transaction, rows)
    sink.pre_commit(transaction)
    return transaction


# -- through Spark ----------------------------------------------------------------------------


def run_query(spark: SparkSession, source: FileInput, checkpoint: Path, batch_fn: object) -> None:
    """All files of ``source`` (one batch each) -> key/value -> 2 hash partitions -> batch_fn."""
    stream = source.read_stream(spark).selectExpr(
        "CAST(id AS STRING) AS key", "payload AS value"
    ).repartition(2, "key")
    query = (
        stream.writeStream.foreachBatch(batch_fn)  # type: ignore[arg-type]
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    except StreamingQueryException as error:
        raise RuntimeError(str(error)) from None
    finally:
        query.stop()


def test_query_output_is_exactly_once_across_a_failure_after_the_sink_committed(
    spark: SparkSession, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = new_topic(kafka_broker)
    source = FileInput(tmp_path / "in", INPUT_SCHEMA)
    batches = [[{"id": b * 10 + i, "payload": f"p{b}-{i}"} for i in range(6)] for b in range(2)]
    source.add_all(batches)
    sink = sinks.kafka(topic, kafka_broker.bootstrap_servers)
    calls: list[int] = []

    def write_then_fail_once(df: DataFrame, batch_id: int) -> None:
        calls.append(batch_id)
        sink(df, batch_id)
        if batch_id == 1 and calls.count(1) == 1:
            # The sink committed batch 1, Spark's commit log has not: a driver death there.
            raise RuntimeError("injected failure between the sink's commit and Spark's")

    with pytest.raises(RuntimeError, match="injected failure"):
        run_query(spark, source, tmp_path / "checkpoint", write_then_fail_once)
    run_query(spark, source, tmp_path / "checkpoint", write_then_fail_once)

    assert calls == [0, 1, 1]  # batch 1 was replayed ...
    expected = sorted((str(r["id"]), str(r["payload"])) for b in batches for r in b)
    assert committed(kafka_broker, topic) == expected  # ... and its records are there once


def test_replaying_a_batch_id_writes_it_once_and_later_batches_still_land(
    spark: SparkSession, kafka_broker: KafkaBroker
) -> None:
    topic = new_topic(kafka_broker)
    sink = sinks.kafka(topic, kafka_broker.bootstrap_servers, sink_id=f"replay-{topic}")
    sink(frame(spark, records(0, 10)), 0)
    sink(frame(spark, records(0, 10)), 0)  # a replay of batch 0
    sink(frame(spark, records(10, 4)), 1)

    assert committed(kafka_broker, topic) == sorted(records(0, 14))
    # Every partition of both batches is marked; batch 2 is not.
    assert all(sink.is_committed(ctx(f"replay-{topic}", 1, p)) for p in (0, 1))
    assert not sink.is_committed(ctx(f"replay-{topic}", 2, 0))


def test_batch_scope_is_one_transaction_per_batch(
    spark: SparkSession, kafka_broker: KafkaBroker
) -> None:
    topic = new_topic(kafka_broker)
    sink = sinks.kafka(topic, kafka_broker.bootstrap_servers, sink_id=topic, scope="batch")
    sink(frame(spark, records(0, 8)), 0)
    sink(frame(spark, records(0, 8)), 0)

    assert committed(kafka_broker, topic) == sorted(records(0, 8))
    assert sink.is_committed(ctx(topic, 0, None))
    assert sink.transactional_id(ctx(topic, 0, None)) == f"keyedstate-{topic}-batch"


def test_binary_values_partitions_and_headers_are_written_as_given(
    spark: SparkSession, kafka_broker: KafkaBroker
) -> None:
    topic = new_topic(kafka_broker, partitions=3)
    sink = sinks.kafka(topic, kafka_broker.bootstrap_servers, sink_id=topic)
    df = spark.createDataFrame(
        [(None, bytearray(b"\x00\xff"), 2, [("trace", bytearray(b"t1"))]), ("k", b"v", 0, None)],
        "key string, value binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    sink(df, 0)

    assert kafka_broker.read_records(topic) == [
        (0, b"k", b"v", []),
        (2, None, b"\x00\xff", [("trace", b"t1")]),
    ]


# -- transactions, attempt by attempt ---------------------------------------------------------


@pytest.mark.usefixtures("spark")  # the sink writes in the session's JVM
def test_an_aborted_attempt_is_invisible_and_its_retry_writes_once(
    kafka_broker: KafkaBroker,
) -> None:
    topic, sink = topic_and_sink(kafka_broker)
    context = ctx(topic, 0)
    # Flushed: the records are in the log, uncommitted.
    failed = prepared(sink, context, as_rows(records(0, 5)))
    sink.abort(failed)

    assert len(kafka_broker.read(topic, "read_uncommitted")) == 5
    assert committed(kafka_broker, topic) == []
    assert not sink.is_committed(context)

    def rows_then_crash() -> Iterator[Row]:
        yield from as_rows(records(0, 3))
        raise ValueError("the task died mid-partition")

    with pytest.raises(ValueError, match="mid-partition"):
        sink.write(context, rows_then_crash())
    assert committed(kafka_broker, topic) == []

    assert sink.write(context, as_rows(records(0, 5))) is WriteOutcome.COMMITTED
    assert sink.write(context, as_rows(records(0, 5))) is WriteOutcome.SKIPPED
    assert committed(kafka_broker, topic) == sorted(records(0, 5))


@pytest.mark.usefixtures("spark")  # the sink writes in the session's JVM
def test_a_zombie_attempt_is_fenced_by_the_next_one(kafka_broker: KafkaBroker) -> None:
    topic, sink = topic_and_sink(kafka_broker)
    context = ctx(topic, 3)
    zombie = prepared(sink, context, as_rows([("zombie", "z")]))

    # A new attempt of the same partition: same transactional.id, so the zombie is fenced and
    # its open transaction aborted.
    assert sink.write(context, as_rows(records(0, 3))) is WriteOutcome.COMMITTED
    with pytest.raises(KafkaSinkError, match="fenced by a newer attempt"):
        sink.commit(zombie)
    with contextlib.suppress(KafkaSinkError):  # as the template does after a failed commit
        sink.abort(zombie)  # (a fenced producer may refuse to abort; its clients close anyway)

    assert committed(kafka_broker, topic) == sorted(records(0, 3))


@pytest.mark.usefixtures("spark")  # the sink writes in the session's JVM
def test_a_kept_producer_fenced_meanwhile_gives_way_to_a_new_one(
    kafka_broker: KafkaBroker,
) -> None:
    """A producer is kept for its id's next transaction; an attempt elsewhere that took the id
    over since (and left a transaction open) fences it: the next write finds that out before
    sending anything, and a new producer aborts the other attempt's transaction and writes."""
    from confluent_kafka import Producer

    topic, sink = topic_and_sink(kafka_broker)
    assert sink.write(ctx(topic, 0), as_rows(records(0, 2))) is WriteOutcome.COMMITTED

    elsewhere = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap_servers,
            "transactional.id": sink.transactional_id(ctx(topic, 1)),
        }
    )
    elsewhere.init_transactions(30)
    elsewhere.begin_transaction()
    elsewhere.produce(topic, key=b"elsewhere", value=b"open")
    elsewhere.flush(30)

    assert sink.write(ctx(topic, 1), as_rows(records(2, 3))) is WriteOutcome.COMMITTED
    assert sink.write(ctx(topic, 2), as_rows(records(5, 1))) is WriteOutcome.COMMITTED  # kept
    assert sink.write(ctx(topic, 2), as_rows(records(5, 1))) is WriteOutcome.SKIPPED
    assert committed(kafka_broker, topic) == sorted(records(0, 6))
    assert sink.is_committed(ctx(topic, 2))


@pytest.mark.usefixtures("spark")  # the sink writes in the session's JVM
def test_an_attempt_that_finds_the_batch_committed_meanwhile_skips_it(
    kafka_broker: KafkaBroker,
) -> None:
    topic, sink = topic_and_sink(kafka_broker)
    context = ctx(topic, 0)
    earlier = prepared(sink, context, as_rows(records(0, 2)))
    sink.commit(earlier)  # committed after a later attempt's first is_committed said no

    assert sink.write(context, as_rows(records(0, 2))) is WriteOutcome.SKIPPED
    assert committed(kafka_broker, topic) == sorted(records(0, 2))


def test_a_named_sink_reused_by_a_new_query_refuses_to_skip_its_batches(
    spark: SparkSession, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = new_topic(kafka_broker)
    sink = sinks.kafka(topic, kafka_broker.bootstrap_servers, sink_id=f"named-{topic}")
    source = FileInput(tmp_path / "in", INPUT_SCHEMA)
    source.add([{"id": 1, "payload": "a"}])
    run_query(spark, source, tmp_path / "first", sink)
    with pytest.raises(RuntimeError, match=r"already committed batch 0 \(query [0-9a-f-]+\)"):
        run_query(spark, source, tmp_path / "second", sink)  # a new checkpoint: a new query id
    assert committed(kafka_broker, topic) == [("1", "a")]


def test_a_batch_before_the_last_committed_one_is_refused_not_skipped(
    spark: SparkSession, kafka_broker: KafkaBroker
) -> None:
    topic, sink = topic_and_sink(kafka_broker)
    sink(frame(spark, records(0, 2), partitions=1), 5)
    # Raised in the task (the JVM's), it reaches the driver inside Spark's job failure, and
    # becomes the sink's error with the task's one line.
    refused = r"^\[KEYEDSTATE_KAFKA_SINK_FAILED\] sink .* committed batch 5 .*skip batch 2"
    with pytest.raises(KafkaSinkError, match=refused) as error:
        sink(frame(spark, records(2, 2), partitions=1), 2)  # e.g. a checkpoint restored from a copy
    assert "\n" not in str(error.value)
    assert committed(kafka_broker, topic) == sorted(records(0, 2))


# -- bad input --------------------------------------------------------------------------------


def test_unreachable_brokers_fail_fast_naming_them(spark: SparkSession) -> None:
    servers = f"127.0.0.1:{free_port()}"
    sink = sinks.kafka("anything", servers, sink_id="unreachable", timeout_s=2)
    started = time.monotonic()
    with pytest.raises(KafkaSinkError, match=rf"cannot reach Kafka at {servers} within 2s"):
        sink(frame(spark, records(0, 1)), 0)
    assert time.monotonic() - started < 15


def test_a_missing_topic_is_named_with_the_fix(
    spark: SparkSession, kafka_broker: KafkaBroker
) -> None:
    sink = sinks.kafka("no-such-topic", kafka_broker.bootstrap_servers, sink_id="missing")
    with pytest.raises(KafkaSinkError, match=r"topic 'no-such-topic' does not exist on .*--create"):
        sink(frame(spark, records(0, 1)), 0)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ("id long, payload string", r"unknown column 'id'.*unknown column 'payload'.*no 'value'"),
        ("key int, value string", r"column 'key' is int, must be string or binary"),
        ("value string, topic string", r"unknown column 'topic'"),
    ],
)
def test_a_dataframe_that_is_not_a_kafka_record_is_refused_naming_columns(
    spark: SparkSession, kafka_broker: KafkaBroker, columns: str, message: str
) -> None:
    sink = sinks.kafka("unused", kafka_broker.bootstrap_servers, sink_id="schema")
    df = spark.createDataFrame([], columns)
    with pytest.raises(KafkaSinkError, match=message):
        sink(df, 0)


def test_malformed_records_are_caught_before_any_write(
    spark: SparkSession, kafka_broker: KafkaBroker
) -> None:
    topic, sink = topic_and_sink(kafka_broker)
    with pytest.raises(KafkaSinkError, match=r"column 'partition' is bigint, must be int"):
        sink(spark.createDataFrame([("v", 0)], "value string, partition long"), 0)
    # Caught on the driver, from the schema: no transaction began, so no mark either.
    assert not sink.is_committed(ctx(topic, 0))
    # A value only the rows show (a header without a key) fails its partition's transaction,
    # naming the column; nothing of the partition becomes visible.
    headers = "value string, headers array<struct<key:string,value:binary>>"
    rows = [("ok", []), ("bad", [(None, bytearray(b"x"))])]
    invalid = r"^\[KEYEDSTATE_KAFKA_INVALID_RECORD\] sink .* partition 0: .*'headers' holds a"
    with pytest.raises(KafkaSinkError, match=invalid):
        sink(spark.createDataFrame(rows, headers).coalesce(1), 0)
    assert kafka_broker.read(topic, "read_committed") == []
    assert not sink.is_committed(ctx(topic, 0))


def test_jvm_failures_map_to_one_line_errors_in_one_place(spark: SparkSession) -> None:
    jvm = spark._jvm  # type: ignore[attr-defined]
    own = jvm.io.keyedstate.sinks.KafkaSinkException("sink s batch 1 partition 0: it broke", None)
    task_failure = jvm.org.apache.spark.SparkException(
        "Job aborted due to stage failure: ...\n\tat executor stack", own
    )
    error, complete = jvm_error("writing batch 1", task_failure)
    assert isinstance(error, KafkaSinkError) and complete
    assert str(error) == "[KEYEDSTATE_KAFKA_SINK_FAILED] sink s batch 1 partition 0: it broke"
    assert error.error_id == "KEYEDSTATE_KAFKA_SINK_FAILED"

    context = jvm.io.keyedstate.sinks.TransactionContext("s", 2, jvm.scala.Option.empty())
    signal = jvm.io.keyedstate.sinks.BatchAlreadyCommittedException(context)
    error, complete = jvm_error("beginning", signal)
    assert isinstance(error, BatchAlreadyCommitted) and str(error) == "sink s batch 2"

    missing = jvm.java.lang.NoClassDefFoundError("org/apache/kafka/clients/producer/Producer")
    error, _ = jvm_error("writing batch 3", jvm.java.lang.RuntimeException("wrapper", missing))
    assert str(error).startswith("writing batch 3: the Kafka sink needs kafka-clients")
    assert "keyedstate.configure(builder, kafka=True)" in str(error)

    other = jvm.java.lang.IllegalStateException("the plan failed\nwith detail")
    error, complete = jvm_error("writing batch 4", jvm.org.apache.spark.SparkException("x", other))
    assert isinstance(error, KafkaSinkError) and not complete
    assert str(error) == "writing batch 4 failed: IllegalStateException: the plan failed"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap_servers": ""}, "bootstrap_servers must be"),
        ({"topic": "bad topic"}, "invalid Kafka topic name 'bad topic'"),
        ({"timeout_s": 0}, "timeout_s must be a positive number"),
        ({"transaction_timeout_s": -1}, "transaction_timeout_s must be a positive number"),
        ({"scope": "task"}, "scope must be 'partition' or 'batch', got 'task'"),
        ({"config": {"transactional.id": "x"}}, r"config must not set \['transactional.id'\]"),
        ({"sink_id": " "}, "sink_id must be a non-empty string"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"bootstrap_servers": "127.0.0.1:9092", "topic": "t", **kwargs}
    with pytest.raises(KafkaSinkError, match=message):
        KafkaSink(**arguments)  # type: ignore[arg-type]


def test_the_sink_needs_no_python_kafka_client() -> None:
    code = (
        "import sys\n"
        "sys.modules['confluent_kafka'] = None\n"  # as if not installed
        "import keyedstate, keyedstate.sinks\n"
        "print(type(keyedstate.sinks.kafka('t', '127.0.0.1:9092')).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "KafkaSink"


def test_without_the_kafka_client_jar_the_sink_says_how_to_add_it(tmp_path: Path) -> None:
    # A session of its own, built by keyedstate.configure without kafka=True.
    code = (
        "import keyedstate, keyedstate.sinks\n"
        "from pyspark.sql import SparkSession\n"
        "spark = keyedstate.configure(SparkSession.builder.master('local[1]')"
        ".config('spark.ui.enabled', 'false')).getOrCreate()\n"
        "df = spark.createDataFrame([('k', 'v')], 'key string, value string')\n"
        "try:\n"
        "    keyedstate.sinks.kafka('t', '127.0.0.1:9092', sink_id='s')(df, 0)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
        "spark.stop()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "KafkaSinkError" in done.stdout, done.stderr[-2000:]
    assert "keyedstate.configure(builder, kafka=True)" in done.stdout


@pytest.mark.usefixtures("spark")  # the sink writes in the session's JVM
def test_a_broker_outage_fails_the_attempt_in_bounded_time_and_the_retry_writes_once(
    kafka_broker: KafkaBroker,
) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    # linger.ms holds the records in the client until the flush: the broker dies with all of
    # them unacknowledged, where the client's own flush would wait forever.
    sink = sinks.kafka(
        topic, kafka_broker.bootstrap_servers, sink_id=topic, timeout_s=3,
        config={"linger.ms": 5000},
    )
    context = ctx(topic, 0)
    attempt = sink.begin_transaction(context)
    sink.invoke(attempt, as_rows(records(0, 4)))
    kafka_broker.kill()
    try:
        started = time.monotonic()
        with pytest.raises(KafkaSinkError, match=kafka_broker.bootstrap_servers):
            sink.pre_commit(attempt)
        with contextlib.suppress(KafkaSinkError):
            sink.abort(attempt)
        assert time.monotonic() - started < 20
    finally:
        kafka_broker.start()

    # The retry's init_transactions aborts whatever the failed attempt left open.
    assert sink.write(context, as_rows(records(0, 4))) is WriteOutcome.COMMITTED
    assert committed(kafka_broker, topic) == sorted(records(0, 4))
