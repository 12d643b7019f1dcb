"""The driver side: checks a keyed function before the query starts and plans it on Spark.

The plan is ``KeyedStateLookup`` (JVM) → ``mapInArrow(KeyedRunner)`` → ``KeyedStateApply``
(JVM): one stateful operator per keyed function, its states in their own column families.
"""

from __future__ import annotations

import json
import sys
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from keyedstate._session import EXTENSIONS_CLASS, EXTENSIONS_KEY
from keyedstate.engine.contexts import RuntimeContextImpl
from keyedstate.engine.keyed_state import KeyState
from keyedstate.engine.runner import KeyedRunner, RunnerPlan, StatePlan
from keyedstate.functions import CheckpointedFunction, KeyedProcessFunction
from keyedstate.state.descriptors import KeyedStateError, StateDescriptor
from keyedstate.state.ttl import StateTtlConfig
from keyedstate.state.types import StateTypeError, to_type_info

__all__ = ["TIMER_MODES", "WATERMARK_METADATA_KEY", "build", "output_struct", "watermark_column"]

WATERMARK_METADATA_KEY = "spark.watermarkDelayMs"
TIMER_MODES = ("none", "event", "processing")
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


def _overrides(function: Any, name: str, base: type) -> bool:  # noqa: ANN401
    method = getattr(type(function), name, None)
    return method is not None and method is not getattr(base, name, None)


_REQUIRED = {
    "process": "process_element",
    "map": "map",
    "flat_map": "flat_map",
    "filter": "filter",
}


def _declared_states(function: Any) -> tuple[list[StateDescriptor], list[StateDescriptor]]:  # noqa: ANN401
    """Runs ``open`` (and ``initialize_state``) once on the driver against a recording context:
    the states it creates are the operator's column families. Returns (keyed, operator) states."""
    try:
        probe = cloudpickle.loads(cloudpickle.dumps(function))
    except Exception as error:  # noqa: BLE001 - any pickling failure
        raise KeyedStateError(
            f"the function {type(function).__name__} cannot be shipped to executors "
            f"(cloudpickle failed: {error})"
        ) from error
    state = KeyState()
    context = RuntimeContextImpl(state, "keyedstate-planning")
    try:
        probe.open(context)
        if isinstance(probe, CheckpointedFunction):
            probe.initialize_state(context)
    except (KeyedStateError, StateTypeError, TypeError):
        raise
    except Exception as error:  # noqa: BLE001 - user code
        raise KeyedStateError(
            f"open() of {type(function).__name__} failed on the driver ({error!r}); keyedstate "
            "runs open() once before the query starts to learn the states it creates (each is "
            "a column family of the state store), so open() must run outside a Spark task too"
        ) from error
    operator = [handle.descriptor for handle in context.operator_states.values()]
    return [handle.descriptor for handle in state.handles.values()], operator  # type: ignore[misc]


def _ttl_options(ttl: StateTtlConfig) -> dict[str, str]:
    """A Flink TTL configuration in the provider's option names (docs/ttl.md)."""
    strategies = ttl.get_cleanup_strategies()
    incremental = strategies.get_incremental_cleanup_strategy()
    compaction = strategies.get_rocksdb_compact_filter_cleanup_strategy() is not None
    # Flink's default (cleanup in background, no strategy named) is the provider's background scan.
    background = strategies.is_cleanup_in_background() and not (
        strategies.in_full_snapshot() or incremental is not None or compaction
    )
    return {
        "duration": str(ttl.ttl_ms),
        # OnReadAndWrite is kept by the engine: a state the function reads is written back.
        "updateType": "OnCreateAndWrite",
        "visibility": (
            "ReturnExpiredIfNotCleanedUp" if ttl.return_expired else "NeverReturnExpired"
        ),
        "timeCharacteristic": "ProcessingTime",
        "cleanup.fullSnapshot": str(strategies.in_full_snapshot()).lower(),
        "cleanup.incremental.size": str(incremental.cleanup_size if incremental else 0),
        "cleanup.incremental.everyRecord": str(
            bool(incremental and incremental.run_cleanup_for_every_record)
        ).lower(),
        "cleanup.compaction": str(compaction).lower(),
        "cleanup.background": str(background).lower(),
    }


def _state_json(descriptor: StateDescriptor, kind: str) -> dict[str, Any]:
    if kind == "map":
        value_type = descriptor.value_type_info.spark_type()  # type: ignore[attr-defined]
        key_type: T.DataType | None = descriptor.key_type_info.spark_type()  # type: ignore[attr-defined]
    elif kind in ("list", "operator_list"):
        value_type = descriptor.element_type_info.spark_type()  # type: ignore[attr-defined]
        key_type = None
    else:
        value_type = descriptor.type_info.spark_type()
        key_type = None
    ttl = descriptor.ttl_config
    return {
        "name": descriptor.name,
        "kind": kind,
        "type": json.loads(value_type.json()),
        "keyType": None if key_type is None else json.loads(key_type.json()),
        "ttl": None if ttl is None or kind == "operator_list" else _ttl_options(ttl),
    }


def _function_globals(function: Any) -> dict[str, Any]:  # noqa: ANN401
    """The module globals that the methods of a class defined in ``__main__`` (a script, a
    notebook) read, as they are now: shipped with the query so that executors see them."""
    snapshot: dict[str, Any] = {}
    for cls in type(function).__mro__:
        module = sys.modules.get(cls.__module__)
        if cls.__module__ != "__main__" or module is None:
            continue
        for value in vars(cls).values():
            target = getattr(value, "__func__", value)
            code = getattr(target, "__code__", None)
            if code is None:
                continue
            for name in code.co_names:
                if name in module.__dict__ and not isinstance(module.__dict__[name], type(sys)):
                    snapshot[name] = module.__dict__[name]
    return snapshot


def _check_extensions(df: DataFrame) -> None:
    configured = df.sparkSession.conf.get(EXTENSIONS_KEY, "") or ""
    if EXTENSIONS_CLASS not in configured.split(","):
        raise KeyedStateError(
            f"keyed functions need {EXTENSIONS_KEY}={EXTENSIONS_CLASS} on the SparkSession (a "
            "static setting): build the session with keyedstate.configure(SparkSession.builder)"
            f"; this session has {EXTENSIONS_KEY}={configured!r}"
        )


def build(
    df: DataFrame,
    key_columns: Sequence[str],
    kind: str,
    function: Any,  # noqa: ANN401 - a user function
    output_schema: OutputSchema,
    *,
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
    reserved = [c for c in columns if c.startswith("__ks_")]
    if reserved:
        raise KeyedStateError(f"input column names starting with '__ks_' are reserved: {reserved}")
    for column in [*key_columns, *([order_by] if order_by else [])]:
        if column not in columns:
            raise KeyedStateError(f"no column {column!r} in the input; columns are {columns}")
    for column in key_columns:
        if isinstance(df.schema[column].dataType, T.MapType):
            raise KeyedStateError(
                f"key column {column!r} is {df.schema[column].dataType.simpleString()}; a map "
                "cannot be a key (Spark cannot group or sort by it)"
            )
    if order_by is not None:
        data_type = df.schema[order_by].dataType
        if not isinstance(data_type, _ORDERABLE):
            raise KeyedStateError(
                f"order_by column {order_by!r} is {data_type.simpleString()}, which cannot be "
                "ordered; use a number, string, date or timestamp column"
            )
    if output_mode not in ("append", "update"):
        raise KeyedStateError(f"output_mode must be 'append' or 'update', got {output_mode!r}")
    _check_extensions(df)

    event_time = watermark_column(df)
    if timer_mode == "auto":
        if kind == "process" and _overrides(function, "on_timer", KeyedProcessFunction):
            timer_mode = "processing" if event_time is None else "auto"
        else:
            timer_mode = "none"
    elif timer_mode not in TIMER_MODES:
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
    keyed, operator = _declared_states(function)
    states = [StatePlan(i, d.name, d.kind, d) for i, d in enumerate(keyed)]
    states += [
        StatePlan(len(keyed) + i, d.name, "operator_list", d) for i, d in enumerate(operator)
    ]
    names = [s.name for s in states]
    clashing = sorted({n for n in names if names.count(n) > 1})
    if clashing:
        raise KeyedStateError(f"keyed and operator states share the names {clashing}")

    spark = df.sparkSession
    spec = {
        "uid": uuid.uuid4().hex,
        "function": type(function).__name__,
        "keyColumns": list(key_columns),
        "orderBy": order_by,
        "states": [_state_json(s.descriptor, s.kind) for s in states],
        "timers": timer_mode != "none",
        "outputSchema": json.loads(struct.json()),
    }
    spec_json = json.dumps(spec)
    jvm = spark._jvm  # type: ignore[attr-defined]
    engine = jvm.io.keyedstate.process.KeyedProcess
    out_schema = T.StructType.fromJson(
        json.loads(engine.outSchemaJson(spec_json, df.schema.json()))
    )
    time_zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
    plan = RunnerPlan(
        kind=kind,
        function=function,
        function_globals=_function_globals(function),
        input_schema=df.schema,
        key_columns=list(key_columns),
        output_schema=struct,
        out_exchange=out_schema,
        states=states,
        timer_mode=timer_mode,
        time_zone=time_zone,
        has_watermark=event_time is not None,
        event_time_column=event_time,
        task_name=type(function).__name__,
        declared={s.name: s.descriptor.signature() for s in states},
    )
    try:
        lookup = DataFrame(engine.lookup(df._jdf, spec_json), spark)
    except Exception as error:  # noqa: BLE001 - py4j errors carry the JVM message
        raise KeyedStateError(f"cannot plan {type(function).__name__}: {error}") from None
    runner = KeyedRunner(plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mapped = lookup.mapInArrow(runner, out_schema)
    return DataFrame(engine.apply(mapped._jdf, spec_json, df.schema.json()), spark)
