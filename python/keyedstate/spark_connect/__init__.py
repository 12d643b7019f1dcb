"""keyedstate on Spark Connect: its plans sent as extension relations, which the server's
``io.keyedstate.sparkconnect.KeyedStateRelationPlugin`` plans as py4j's entry points do in a
classic session (the package is not named ``connect``: that is the broadcast API's function).
Importing this package needs PySpark's Connect client (``pip install 'pyspark[connect]'``); the
rest of keyedstate imports it only for a Connect DataFrame."""

from __future__ import annotations

from typing import Any

__all__ = ["is_connect", "is_instance"]


def is_connect(frame: Any) -> bool:  # noqa: ANN401 - a DataFrame or a SparkSession of either kind
    """Whether ``frame`` (a DataFrame or a SparkSession) belongs to a Spark Connect session,
    told without importing PySpark's Connect client."""
    return type(frame).__module__.startswith("pyspark.sql.connect.")


def is_instance(obj: Any, cls: type) -> bool:  # noqa: ANN401 - any object
    """``isinstance(obj, cls)`` for a classic PySpark class (``StreamingQuery``,
    ``DataStreamWriter``, ``SparkSession``, ``SparkSession.Builder``), also true for Spark
    Connect's class of that name, which is not a subclass of it; told without importing PySpark's
    Connect client."""
    return isinstance(obj, cls) or (
        is_connect(obj)
        and any(
            c.__name__ == cls.__name__ and c.__module__.startswith("pyspark.sql.connect.")
            for c in type(obj).__mro__
        )
    )
