"""The state API's tests run twice: in the tests' classic session, and from a Spark Connect
client of one Connect server for the whole test session (``connect_spark``, keyedstate's
``connect-server`` on 127.0.0.1). A test that needs a classic session (the SparkContext, a driver
script of its own) is marked ``classic_only``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession


@pytest.fixture
def spark(spark: SparkSession, spark_mode: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The classic session, or the Connect session with PySpark in Connect mode for the test."""
    if spark_mode == "classic":
        yield spark
    else:
        yield request.getfixturevalue("connect_spark")
