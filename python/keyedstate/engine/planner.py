"""The driver side: checks a keyed function before the query starts and plans it on Spark.

The plan is ``df.groupBy(pmod(hash(keys), buckets)).applyInPandasWithState(...)`` with one
binary state column per bucket; the executor side is :class:`BucketOperator`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.state import GroupStateTimeout

from keyedstate.engine.operator import STATE_SCHEMA, BucketOperator, OperatorPlan
from keyedstate.functions import (
    TIMER_MODES,
    CheckpointedFunction,
    KeyedProcessFunction,
    _RuntimeContextImpl,
)
from keyedstate.state.backend import KeyedStateBackend
from keyedstate.state.descriptors import KeyedStateError
from keyedstate.state.types import StateTypeError, to_type_info

__all__ = ["WATERMARK_METADATA_KEY", "build", "output_struct", "watermark_column"]

WATERMARK_METADATA_KEY = "spark.watermarkDelayMs"
BUCKET_COLUMN = "__keyedstate_bucket"
DEFAULT_BUCKETS = 128
_ORDERABLE = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
    T.StringType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)

OutputSchema = T.StructType | str | Sequence[tuple[str, Any]] | Mapping[str, Any]


def output_struct(schema: OutputSchema) -> T.StructType:
    """The output schema as a StructType: a StructType, a DDL string (``"id string, n long"``),
    or ``(name, type)`` pairs / a ``{name: type}`` dict where a type is anything
    ``to_type_info`` takes (``int``, ``Types.LONG()``, ``list[str]``, a Spark DataType)."""
    if isinstance(schema, T.StructType):
        struct = schema
    elif isinstance(schema, str):
        try:
            parsed = T.StructType.fromDDL(schema)
        except Exception as error:  # noqa: BLE001 - Spark's parse errors
            raise StateTypeError(f"cannot parse output schema {schema!r}: {error}") from None
        struct = (
            parsed
            if isinstance(parsed, T.StructType)
            else T.StructType([T.StructField("value", parsed)])
        )
    else:
        pairs = list(schema.items()) if isinstance(schema, Mapping) else list(schema)
        fields = []
        for pair in pairs:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise StateTypeError(
                    f"an output schema is a StructType, a DDL string, a dict or (name, type) "
                    f"pairs; got {pair!r}"
                )
            name, declared = pair
            fields.append(T.StructField(name, to_type_info(declared).spark_type(), True))
        struct = T.StructType(fields)
    if not struct.fields:
        raise StateTypeError("the output schema has no columns")
    names = [f.name for f in struct.fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise StateTypeError(f"the output schema repeats column names {duplicates}")
    return struct


def watermark_column(df: DataFrame) -> str | None:
    """The input's event-time column (the one ``withWatermark`` marked), if any."""
    for f in df.schema.fields:
        if f.metadata and WATERMARK_METADATA_KEY in f.metadata:
            if isinstance(f.dataType, T.TimestampType | T.TimestampNTZType):
                return f.name
    return None


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _overrides(function: Any, name: str, base: type) -> bool:  # noqa: ANN401
    method = getattr(type(function), name, None)
    return method is not None and method is not getattr(base, name, None)


_REQUIRED = {
    "process": "process_element",
    "map": "map",
    "flat_map": "flat_map",
    "filter": "filter",
}


def _dry_open(function: Any, num_buckets: int) -> list[Any]:  # noqa: ANN401
    """Runs ``open`` (and ``initialize_state``) once on the driver against a recording context,
    so that bad descriptors (unknown types, a name reused with another kind) fail here. Returns
    the registered descriptors. Errors that are not the API's own skip the check with a warning:
    ``open`` may use resources that only exist on executors."""
    try:
        probe = cloudpickle.loads(cloudpickle.dumps(function))
    except Exception as error:  # noqa: BLE001 - any pickling failure
        raise KeyedStateError(
            f"the function {type(function).__name__} cannot be shipped to executors "
            f"(cloudpickle failed: {error})"
        ) from error
    backend = KeyedStateBackend()
    backend.begin(0, num_buckets, None, 0, -(2**63))
    backend.set_current_key(None)
    context = _RuntimeContextImpl(backend, num_buckets, "keyedstate-validation")
    try:
        probe.open(context)
        if isinstance(probe, CheckpointedFunction):
            probe.initialize_state(context)
    except (KeyedStateError, StateTypeError, TypeError):
        raise
    except Exception as error:  # noqa: BLE001 - user code
        warnings.warn(
            f"keyedstate: open() of {type(function).__name__} failed on the driver ({error!r}); "
            "state declarations are checked on the executors instead",
            stacklevel=4,
        )
    return [handle.descriptor for handle in backend.handles.values()]


def build(
    df: DataFrame,
    key_columns: Sequence[str],
    kind: str,
    function: Any,  # noqa: ANN401 - a user function
    output_schema: OutputSchema,
    *,
    num_buckets: int,
    order_by: str | None,
    timer_mode: str = "auto",
    output_mode: str = "append",
) -> DataFrame:
    """Checks everything that can be checked before the query starts, then plans it."""
    if not isinstance(df, DataFrame) and type(df).__name__ != "DataFrame":
        raise TypeError(f"key_by needs a DataFrame, got {type(df).__name__}")
    if not df.isStreaming:
        raise KeyedStateError(
            "keyedstate runs on streaming DataFrames (spark.readStream...); for a static "
            "DataFrame use groupBy().applyInPandas"
        )
    required = _REQUIRED[kind]
    if not callable(getattr(function, required, None)):
        raise TypeError(
            f"{kind}() needs a function object with a {required}() method "
            f"(for example a {'KeyedProcessFunction' if kind == 'process' else 'Rich*Function'}),"
            f" got {type(function).__name__}"
        )
    if not callable(getattr(function, "open", None)):
        raise TypeError(
            f"{type(function).__name__} must derive from a keyedstate function class "
            "(it has no open())"
        )
    columns = df.schema.names
    if BUCKET_COLUMN in columns:
        raise KeyedStateError(f"the input already has a column named {BUCKET_COLUMN!r}")
    for column in [*key_columns, *([order_by] if order_by else [])]:
        if column not in columns:
            raise KeyedStateError(f"no column {column!r} in the input; columns are {columns}")
    if order_by is not None:
        data_type = df.schema[order_by].dataType
        if not isinstance(data_type, _ORDERABLE):
            raise KeyedStateError(
                f"order_by column {order_by!r} is {data_type.simpleString()}, which cannot be "
                "ordered; use a number, string, date or timestamp column"
            )
    if not isinstance(num_buckets, int) or isinstance(num_buckets, bool) or num_buckets < 1:
        raise KeyedStateError(f"buckets must be a positive int, got {num_buckets!r}")
    if output_mode not in ("append", "update"):
        raise KeyedStateError(f"output_mode must be 'append' or 'update', got {output_mode!r}")

    event_time = watermark_column(df)
    if timer_mode == "auto":
        if kind == "process" and _overrides(function, "on_timer", KeyedProcessFunction):
            timer_mode = "event" if event_time is not None else "processing"
        else:
            timer_mode = "none"
    if timer_mode not in TIMER_MODES:
        raise KeyedStateError(
            f"timer_mode must be 'auto', 'none', 'event' or 'processing', got {timer_mode!r}"
        )
    if timer_mode == "event" and event_time is None:
        raise KeyedStateError(
            "timer_mode='event' needs an event-time watermark: call "
            "df.withWatermark('<timestamp column>', '<delay>') before key_by"
        )
    if timer_mode != "none" and kind != "process":
        raise KeyedStateError("timers are only available to KeyedProcessFunction (process())")

    struct = output_struct(output_schema) if kind != "filter" else df.schema
    _dry_open(function, num_buckets)

    plan = OperatorPlan(
        kind=kind,
        function=function,
        input_schema=df.schema,
        key_columns=list(key_columns),
        output_schema=struct,
        num_buckets=num_buckets,
        timer_mode=timer_mode,
        time_zone=df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC",
        event_time_column=event_time,
        order_by=order_by,
        task_name=type(function).__name__,
    )
    operator = BucketOperator(plan)

    def keyedstate_bucket(key: Any, pdfs: Any, state: Any) -> Any:  # noqa: ANN401
        return operator(key, pdfs, state)

    bucket = F.pmod(F.hash(*[F.col(_quoted(c)) for c in key_columns]), F.lit(num_buckets))
    timeout = {
        "none": GroupStateTimeout.NoTimeout,
        "event": GroupStateTimeout.EventTimeTimeout,
        "processing": GroupStateTimeout.ProcessingTimeTimeout,
    }[timer_mode]
    # The bucket column comes last; the executors read the input columns by position.
    return (
        df.withColumn(BUCKET_COLUMN, bucket)
        .groupBy(BUCKET_COLUMN)
        .applyInPandasWithState(keyedstate_bucket, struct, STATE_SCHEMA, output_mode, timeout)
    )
