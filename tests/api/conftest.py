"""The state API's tests run twice: in the tests' classic session, and from a Spark Connect
client of one Connect server for the whole test session (``connect_server``, keyedstate's
``connect-server`` on 127.0.0.1). A test that needs a classic session (the SparkContext, a driver
script of its own) is marked ``classic_only``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

# PySpark's functions and column helpers build Connect expressions while this is set; pyspark
# sets it for the whole process once a Connect session exists, so it is set only around the tests
# that use the Connect session and the classic tests of the other modules still get classic ones.
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the Connect runs of the tests marked ``classic_only``."""
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_connect = callspec is not None and callspec.params.get("spark_mode") == "connect"
        (dropped if on_connect and item.get_closest_marker("classic_only") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def _connect_session(connect_server: Any) -> Iterator[SparkSession]:  # noqa: ANN401
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(connect_server.url).getOrCreate()
    yield session  # type: ignore[misc]
    session.stop()


@pytest.fixture(scope="session", params=["classic", "connect"])
def spark_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def spark(spark: SparkSession, spark_mode: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The classic session, or a Connect session with PySpark in Connect mode for the test."""
    if spark_mode == "classic":
        yield spark
        return
    session = request.getfixturevalue("_connect_session")
    before = os.environ.get(_CONNECT_MODE)
    os.environ[_CONNECT_MODE] = "1"
    try:
        yield session
    finally:
        if before is None:
            os.environ.pop(_CONNECT_MODE, None)
        else:
            os.environ[_CONNECT_MODE] = before
