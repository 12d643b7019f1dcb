"""The runtime tests' fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from keyedstate.runtime.checkpoint_config import MIN_BATCHES_TO_RETAIN_KEY
from pyspark.sql import SparkSession

from tests.support.supervisor_support import no_query_left


@pytest.fixture
def clean(spark: SparkSession) -> Iterator[SparkSession]:
    """The session, left with no query running and its retained batches as they were."""
    retained = spark.conf.get(MIN_BATCHES_TO_RETAIN_KEY)
    yield spark
    no_query_left(spark)
    spark.conf.set(MIN_BATCHES_TO_RETAIN_KEY, retained)
