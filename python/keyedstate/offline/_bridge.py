"""The JVM side of the offline operations (``io.keyedstate.offline``): calling an entry point
(through py4j in a classic session, as an operation relation on Spark Connect) and turning its
failures and its JSON results into the package's errors and dataclasses."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from keyedstate._session import PROVIDER_CLASS
from keyedstate.errors import CheckpointOperationError, first_line, state_error
from keyedstate.spark_connect import is_connect

T = TypeVar("T")


def operation(
    spark: SparkSession, name: str, *args: Any, frames: Mapping[str, DataFrame] | None = None
) -> str:
    """Operation ``name``'s JSON answer, given ``args`` and ``frames`` (DataFrames by name): the
    JVM's one registry of them (``io.keyedstate.sparkconnect.ConnectOperations``) runs it, called
    through py4j, or on Spark Connect sent as an operation relation. A failure is mapped as
    :func:`call` maps it."""
    if is_connect(spark):
        from keyedstate.spark_connect import relations

        return str(call(relations.operation, spark, name, list(args), frames))
    operations, session = entry_point(spark, "ConnectOperations", "sparkconnect")
    java_map = spark.sparkContext._jvm.java.util.HashMap()  # type: ignore[union-attr]
    for key, frame in (frames or {}).items():
        java_map.put(key, frame._jdf)
    return str(call(operations.run, session, name, json.dumps(list(args)), java_map))


def call(method: Any, *args: Any) -> Any:
    """``method(*args)`` in the JVM. A failure is a ``CheckpointOperationError``: keyedstate's
    own (the store, the version, the file), found among the causes of Spark's wrappers (a failed
    job, a state-store error class), also of its family's class (``keyedstate.errors``); else
    the error's first line. Spark's job failures embed executor stack traces: never shown.

    pyspark converts some JVM errors (``IllegalArgumentException``, Spark's error classes) into
    its ``CapturedException`` classes before they reach here; the rest stay ``Py4JJavaError``.
    On Spark Connect every failure comes as one of PySpark's Connect exceptions, the JVM's
    message in its text."""
    try:
        return method(*args)
    except (Py4JJavaError, PySparkException) as e:
        mapped = state_error(e, operation=True)
        if mapped is None:
            java = e.java_exception if isinstance(e, Py4JJavaError) else None
            line = first_line(java) if java is not None else (str(e).splitlines() or [""])[0]
            mapped = CheckpointOperationError(line or str(e))
        raise mapped from e


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def decode(cls: type[T], raw: dict[str, Any]) -> T:
    """A result dataclass from the JVM's JSON (camelCase field names, same fields)."""
    values = {snake(k): v for k, v in raw.items()}
    return cls(**{f.name: values[f.name] for f in fields(cls)})  # type: ignore[call-arg]


def entry_point(spark: SparkSession, name: str, package: str = "offline") -> tuple[Any, Any]:
    """The JVM object ``io.keyedstate.<package>.<name>`` and the session's JVM side."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    if jvm is None:
        raise RuntimeError("the SparkSession has no JVM (Spark Connect is not supported here)")
    where = jvm.io.keyedstate
    for part in filter(None, package.split(".")):
        where = getattr(where, part)
    entry = getattr(where, name)
    if not isinstance(entry, JavaClass):
        raise RuntimeError(
            f"{PROVIDER_CLASS} is not on the session's classpath; build the session with "
            "keyedstate.configure(SparkSession.builder)"
        )
    return entry, spark._jsparkSession  # type: ignore[attr-defined]
