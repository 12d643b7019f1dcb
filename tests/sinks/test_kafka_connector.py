"""Spark's own Kafka source and sink on pyspark 4.3.0, with the 4.2.0 connector jars fetched by
`make connectors` (docs/exactly-once.md, "Kafka connector"), against a real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import keyedstate
import pyspark
import pytest
from keyedstate._session import SUPPORTED_SPARK
from keyedstate.errors import InvalidOptionError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.support.servers.kafka_broker import KafkaBroker
from tests.support.streaming_harness import KAFKA_CONNECTOR_JARS, QUERY_TIMEOUT_S


@pytest.fixture(scope="module", autouse=True)
def connector_on_classpath(spark: SparkSession) -> None:
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    assert "spark-sql-kafka-0-10" in jars, (
        f"Spark's Kafka connector is not on the session's classpath (no jars in "
        f"{KAFKA_CONNECTOR_JARS} when the session started): run `make connectors`"
    )


def run_available_now(spark: SparkSession, broker: KafkaBroker, source: str, sink: str,
                      checkpoint: Path) -> list[int]:
    """Kafka topic ``source`` -> upper-cased values -> Kafka topic ``sink``, everything available
    now, at most 8 records per batch; the input row count of each batch."""
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 8)
        .load()
    )
    query = (
        stream.select("key", F.upper(F.col("value").cast("string")).alias("value"))
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
        assert query.exception() is None, query.exception()
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()


def test_kafka_source_and_sink_exact_records_and_resume_from_checkpoint(
    spark: SparkSession, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    source = kafka_broker.create_topic(f"connector-in-{suffix}", partitions=2)
    sink = kafka_broker.create_topic(f"connector-out-{suffix}", partitions=1)
    first = [(f"k{i}", f"v{i}") for i in range(20)]
    for partition in (0, 1):
        kafka_broker.produce(source, first[partition::2], partition=partition)

    batches = run_available_now(spark, kafka_broker, source, sink, tmp_path / "checkpoint")

    # maxOffsetsPerTrigger splits the 20 records into batches of at most 8.
    assert sum(batches) == 20 and max(batches) <= 8 and len(batches) == 3
    expected = sorted((k.encode(), v.upper().encode()) for k, v in first)
    assert sorted((key, value) for _, key, value in kafka_broker.read(sink)) == expected

    # The checkpoint keeps the source's offsets: a second run reads only what came since.
    second = [(f"k{i}", f"w{i}") for i in range(20, 25)]
    kafka_broker.produce(source, second, partition=0)
    batches = run_available_now(spark, kafka_broker, source, sink, tmp_path / "checkpoint")

    assert batches == [5]
    expected += sorted((k.encode(), v.upper().encode()) for k, v in second)
    assert sorted((key, value) for _, key, value in kafka_broker.read(sink)) == sorted(expected)


def test_configure_kafka_adds_the_connector_package_once_keeping_others() -> None:
    builder = SparkSession.builder.config("spark.jars.packages", "org.example:other:1.0")
    builder = keyedstate.configure(keyedstate.configure(builder, kafka=True), kafka=True)
    assert builder._options["spark.jars.packages"] == (
        "org.example:other:1.0,org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    )
    assert "spark.jars.packages" not in keyedstate.configure(SparkSession.builder)._options
    with pytest.raises(ValueError, match="kafka= must be True or False, got 'yes'"):
        keyedstate.configure(SparkSession.builder, kafka="yes")  # type: ignore[arg-type]


def test_the_connector_follows_the_sparks_minor_version() -> None:
    package = keyedstate._session.kafka_connector_package
    assert package("4.1.4") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.3"
    assert package("4.2.1") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert package("4.3.0") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert package() == package(pyspark.__version__)
    assert set(keyedstate._session.KAFKA_CONNECTOR_VERSIONS) == set(SUPPORTED_SPARK)
    with pytest.raises(InvalidOptionError, match="not for Spark 3.5.1"):
        package("3.5.1")


def test_missing_broker_jars_name_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEYEDSTATE_KAFKA_JARS", str(tmp_path))
    with pytest.raises(RuntimeError, match=rf"jars not found in {tmp_path}: run `make connectors`"):
        KafkaBroker()
