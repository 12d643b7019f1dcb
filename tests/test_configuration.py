"""The Python wiring and the provider's option validation, on real Spark."""

from __future__ import annotations

import re
from pathlib import Path

import keyedstate
import pytest
from keyedstate import _session
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_configure_sets_jar_provider_and_options() -> None:
    builder = keyedstate.configure(
        SparkSession.builder, compression="zstd", track_num_keys=False, transfer_threads=8
    )
    options = builder._options  # the builder's pending settings
    assert options["spark.jars"] == keyedstate.jar_path()
    assert Path(options["spark.jars"]).is_file()
    assert options["spark.sql.streaming.stateStore.providerClass"] == keyedstate.PROVIDER_CLASS
    assert options["spark.sql.streaming.stateStore.keyedstate.compression"] == "zstd"
    assert options["spark.sql.streaming.stateStore.keyedstate.trackNumKeys"] == "false"
    assert options["spark.sql.streaming.stateStore.keyedstate.transferThreads"] == "8"


def test_configure_rejects_unknown_options_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"block_cache_size\b.*allowed: .*block_cache_size_mb"):
        keyedstate.configure(SparkSession.builder, block_cache_size=5)


def test_every_option_is_documented() -> None:
    text = DOCS.read_text()
    for keyword, key in _session.OPTIONS.items():
        row = re.search(rf"^\| `{key}` \| `{keyword}` \|", text, re.MULTILINE)
        assert row, f"docs/configuration.md has no row for {key} ({keyword})"


def test_invalid_value_fails_the_query_naming_key_value_and_allowed(
    spark: SparkSession, tmp_path: Path, provider_under_test: str
) -> None:
    key = "spark.sql.streaming.stateStore.keyedstate.compression"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider_under_test)
    spark.conf.set(key, "brotli")
    try:
        counts = (
            spark.readStream.format("rate").option("rowsPerSecond", 10).load()
            .groupBy((F.col("value") % 3).alias("k")).count()
        )
        query = (
            counts.writeStream.format("noop").outputMode("update")
            .option("checkpointLocation", str(tmp_path / "ck")).start()
        )
        with pytest.raises(StreamingQueryException) as failure:
            query.awaitTermination(120)
        message = str(failure.value)
        assert "Invalid value 'brotli'" in message
        assert key in message
        assert "one of none, snappy, lz4, zstd" in message
    finally:
        spark.conf.unset(key)
