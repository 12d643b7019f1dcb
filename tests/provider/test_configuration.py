"""The Python wiring and the provider's option validation, on real Spark."""

from __future__ import annotations

import re
from pathlib import Path

import keyedstate
import pytest
from keyedstate import _session
from pyspark.errors import IllegalArgumentException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.support.paths import DOCS

CONFIGURATION_DOC = DOCS / "configuration.md"


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
    text = CONFIGURATION_DOC.read_text()
    for keyword, option in _session.OPTIONS.items():
        name = option["key"].removeprefix(keyedstate.OPTION_PREFIX)
        row = re.search(rf"^\| `{name}` \| `{keyword}` \|", text, re.MULTILINE)
        assert row, f"docs/configuration.md has no row for {name} ({keyword})"


@pytest.mark.parametrize(
    ("keyword", "value", "allowed"),
    [
        ("compression", "brotli", "one of none, snappy, lz4, zstd"),
        ("block_cache_size_mb", 0, "an integer from 1 to 1048576"),
        ("transfer_threads", "4.5", "an integer from 1 to 256"),
        ("track_num_keys", "yes", "true or false"),
        ("local_dir", "relative/dir", "an absolute local directory path"),
    ],
)
def test_configure_refuses_a_bad_value_naming_key_value_and_allowed(
    keyword: str, value: object, allowed: str
) -> None:
    with pytest.raises(ValueError) as failure:
        keyedstate.configure(SparkSession.builder, **{keyword: value})
    message = str(failure.value)
    assert f"Invalid value {value!r} for {keyword}=" in message
    assert _session.OPTIONS[keyword]["key"] in message and allowed in message


def test_invalid_value_fails_the_query_start_naming_key_value_and_allowed(
    spark: SparkSession, tmp_path: Path, provider_under_test: str
) -> None:
    """Set on the session after configure(): the streaming query fails on the driver as it is
    defined (Spark analyses a streaming DataFrame when it is created), before any batch."""
    key = "spark.sql.streaming.stateStore.keyedstate.compression"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider_under_test)
    spark.conf.set(key, "brotli")
    checkpoint = tmp_path / "ck"
    try:
        with pytest.raises(IllegalArgumentException) as failure:
            counts = (
                spark.readStream.format("rate").option("rowsPerSecond", 10).load()
                .groupBy((F.col("value") % 3).alias("k")).count()
            )
            counts.writeStream.format("noop").outputMode("update").option(
                "checkpointLocation", str(checkpoint)
            ).start()
        message = str(failure.value)
        assert len(message) < 400, message
        assert "Invalid value 'brotli'" in message
        assert key in message
        assert "one of none, snappy, lz4, zstd" in message
        assert not (checkpoint / "offsets").exists() and not (checkpoint / "state").exists()
        # A streaming DataFrame defined before the bad value was set: start() fails.
        spark.conf.unset(key)
        counts = (
            spark.readStream.format("rate").option("rowsPerSecond", 10).load()
            .groupBy((F.col("value") % 3).alias("k")).count()
        )
        spark.conf.set(key, "brotli")
        with pytest.raises(IllegalArgumentException, match="Invalid value 'brotli'"):
            counts.writeStream.format("noop").outputMode("update").option(
                "checkpointLocation", str(checkpoint)
            ).start()
        assert not (checkpoint / "offsets").exists() and not (checkpoint / "state").exists()
    finally:
        spark.conf.unset(key)
