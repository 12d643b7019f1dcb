"""PySpark in Spark Connect mode for a block of a test.

PySpark's functions and column helpers build Connect expressions while
``SPARK_CONNECT_MODE_ENABLED`` is set. PySpark sets it for the whole process once a Connect
session is made through ``SparkSession.builder``; the tests make theirs with Connect's own
builder and set the mode only around the code that uses it, so the classic tests of the same
process still get classic expressions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


@contextmanager
def connect_mode() -> Iterator[None]:
    before = os.environ.get(_CONNECT_MODE)
    os.environ[_CONNECT_MODE] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_CONNECT_MODE, None)
        else:
            os.environ[_CONNECT_MODE] = before


def connect_session(url: str) -> Any:  # noqa: ANN401 - a Connect SparkSession
    """A new Connect client session of the server at ``url`` (not a cached one: a test may
    talk to a server started again on another port)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.builder.remote(url).create()
