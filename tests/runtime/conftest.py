"""The runtime tests' fixtures: the supervisor's tests on real queries run in the classic session
and from a Spark Connect client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from keyedstate.runtime.checkpoint_config import MIN_BATCHES_TO_RETAIN_KEY
from pyspark.sql import SparkSession

from tests.support.supervisor_support import no_query_left


@pytest.fixture
def clean(spark: SparkSession, spark_mode: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session, left with no query running and its retained batches as they were: the
    classic session, or the Connect session (a supervisor of a Connect client's query; the
    tests that need the classic one are marked ``classic_only``)."""
    session = spark if spark_mode == "classic" else request.getfixturevalue("connect_spark")
    retained = session.conf.get(MIN_BATCHES_TO_RETAIN_KEY)
    yield session
    no_query_left(session)
    session.conf.set(MIN_BATCHES_TO_RETAIN_KEY, retained)
