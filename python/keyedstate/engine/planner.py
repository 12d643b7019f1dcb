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
from keyedstate.engine.function_copy import copy_function
from keyedstate.engine.keyed_state import KeyState
from keyedstate.engine.runner import KeyedRunner, RunnerPlan, StatePlan
from keyedstate.functions import (
    CheckpointedFunction,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
)
from keyedstate.keyed_stream import SPREAD_COLUMN
from keyedstate.spark_connect import is_connect
from keyedstate.state.descriptors import (
    BROADCAST,
    OPERATOR_STATE_KINDS,
    ListStateDescriptor,
    StateDescriptor,
    StateUsageError,
)
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


# Types Spark cannot order (the spatial ones are new in Spark 4.1).
_UNORDERABLE = tuple(
    getattr(T, name)
    for name in ("VariantType", "CalendarIntervalType", "GeometryType", "GeographyType")
    if hasattr(T, name)
)


def _unkeyable(data_type: T.DataType) -> str | None:
    """What in ``data_type`` (nested too) Spark cannot sort or group by, if anything."""
    if isinstance(data_type, T.MapType):
        return "a map"
    if isinstance(data_type, _UNORDERABLE):
        return f"a {data_type.simpleString()}"
    if isinstance(data_type, T.ArrayType):
        return _unkeyable(data_type.elementType)
    if isinstance(data_type, T.StructType):
        return next((u for f in data_type.fields if (u := _unkeyable(f.dataType))), None)
    return None


def _non_binary_collations(data_type: T.DataType) -> list[str]:
    """The collations in ``data_type`` (nested ones too) whose equal strings may differ in
    bytes: every collation but UTF8_BINARY."""
    if isinstance(data_type, T.StringType):
        return [] if data_type.collation == "UTF8_BINARY" else [data_type.collation]
    if isinstance(data_type, T.ArrayType):
        return _non_binary_collations(data_type.elementType)
    if isinstance(data_type, T.StructType):
        return sorted({c for f in data_type.fields for c in _non_binary_collations(f.dataType)})
    return []


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


def _mentions(function: Any, name: str) -> bool:  # noqa: ANN401
    """Whether the code of the function's class (its methods and what they define, not
    keyedstate's base classes) names ``name``: a static look, for what must be planned ahead."""

    def in_code(code: Any) -> bool:  # noqa: ANN401
        return name in code.co_names or any(
            in_code(c) for c in code.co_consts if hasattr(c, "co_names")
        )

    for cls in type(function).__mro__:
        if cls.__module__.startswith("keyedstate."):
            continue
        for value in vars(cls).values():
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            if code is not None and in_code(code):
                return True
    return False


_REQUIRED = {
    "process": "process_element",
    "map": "map",
    "flat_map": "flat_map",
    "filter": "filter",
}


def _declared_states(
    function: Any,  # noqa: ANN401
) -> tuple[list[StateDescriptor], list[tuple[StateDescriptor, str]]]:
    """Runs ``open`` (and ``initialize_state``) once on the driver against a recording context:
    the states it creates are the operator's column families. Returns the keyed states and the
    operator states with their kinds (split or union redistribution)."""
    try:
        # Made as executors get it: open() on the driver changes nothing shipped.
        probe = copy_function(function)
    except Exception as error:  # noqa: BLE001 - any pickling failure
        raise StateUsageError(
            f"the function {type(function).__name__} cannot be shipped to executors "
            f"(cloudpickle failed: {error})"
        ) from error
    state = KeyState()
    context = RuntimeContextImpl(state, "keyedstate-planning")
    try:
        probe.open(context)
        if isinstance(probe, CheckpointedFunction):
            probe.initialize_state(context)
    except (StateUsageError, StateTypeError, TypeError):
        raise
    except Exception as error:  # noqa: BLE001 - user code
        raise StateUsageError(
            f"open() of {type(function).__name__} failed on the driver ({error!r}); keyedstate "
            "runs open() once before the query starts to learn the states it creates (each is "
            "a column family of the state store), so open() must run outside a Spark task too"
        ) from error
    operator = [(handle.descriptor, handle.kind) for handle in context.operator_states.values()]
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
    elif kind == BROADCAST:
        value_type = descriptor.value_type_info.spark_type()  # type: ignore[attr-defined]
        key_type = descriptor.key_type_info.spark_type()  # type: ignore[attr-defined]
    elif kind == ListStateDescriptor.kind or kind in OPERATOR_STATE_KINDS:
        value_type = descriptor.element_type_info.spark_type()  # type: ignore[attr-defined]
        key_type = None
    else:
        value_type = descriptor.type_info.spark_type()
        key_type = None
    ttl = descriptor.ttl_config
    queryable = descriptor.get_queryable_state_name()
    if queryable is not None and (kind == BROADCAST or kind in OPERATOR_STATE_KINDS):
        raise StateUsageError(
            f"state {descriptor.name!r} is {kind} state, which is not queryable: only keyed states "
            "(value, list, map, reducing, aggregating) are read by key (set_queryable)"
        )
    value_info = getattr(descriptor, "value_type_info", None) or getattr(
        descriptor, "element_type_info", descriptor.type_info
    )
    key_info = getattr(descriptor, "key_type_info", None)
    return {
        "name": descriptor.name,
        "queryable": queryable,
        # The client unpickles values stored as pickles (Types.PICKLED_BYTE_ARRAY()).
        "pickled": {
            "value": value_info.is_pickled(),
            "mapKey": key_info is not None and key_info.is_pickled(),
        },
        "kind": kind,
        "type": json.loads(value_type.json()),
        "keyType": None if key_type is None else json.loads(key_type.json()),
        "ttl": None if ttl is None or kind in OPERATOR_STATE_KINDS else _ttl_options(ttl),
    }


def _pickled_by_value(cls: type) -> bool:
    """Whether cloudpickle ships ``cls`` by value (``__main__``, or a module registered with
    ``register_pickle_by_value``) rather than by import."""
    try:
        return not cloudpickle.cloudpickle._should_pickle_by_reference(cls)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a cloudpickle without this helper
        return cls.__module__ == "__main__"


def _function_globals(function: Any) -> dict[str, Any]:  # noqa: ANN401
    """The module globals that the methods of a class shipped by value (defined in a script, a
    notebook) read, as they are now: shipped with the query so that executors see them."""
    snapshot: dict[str, Any] = {}
    for cls in type(function).__mro__:
        module = sys.modules.get(cls.__module__)
        if module is None or cls is object or not _pickled_by_value(cls):
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


SIDE_COLUMN = "__ks_side"
SIDE_OUTPUTS_ATTRIBUTE = "_keyedstate_side_outputs"

SideOutputs = Mapping[Any, OutputSchema] | Sequence[Any] | None


def _side_schemas(side_outputs: SideOutputs) -> list[tuple[str, T.StructType]]:
    """``(tag name, schema)`` per declared side output: ``{OutputTag: schema}``, or OutputTags
    whose type gives the schema (a row type's fields, else one column ``value``)."""
    if not side_outputs:
        return []
    pairs = (
        list(side_outputs.items())
        if isinstance(side_outputs, Mapping)
        else [(tag, None) for tag in side_outputs]
    )
    out: list[tuple[str, T.StructType]] = []
    for tag, schema in pairs:
        tag_id = getattr(tag, "tag_id", None)
        if not isinstance(tag_id, str):
            raise StateUsageError(f"side outputs are declared with OutputTag objects, got {tag!r}")
        if schema is None:
            info = getattr(tag, "type_info", None)
            if info is None:
                raise StateUsageError(
                    f"side output {tag_id!r} has no type: declare OutputTag({tag_id!r}, "
                    "Types.ROW_NAMED(...)) or pass side_outputs={tag: schema}"
                )
            spark_type = info.spark_type()
            struct = (
                spark_type
                if isinstance(spark_type, T.StructType)
                else T.StructType([T.StructField("value", spark_type)])
            )
        else:
            struct = output_struct(schema)
        out.append((tag_id, struct))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise StateUsageError(f"side output names repeat: {names}")
    return out


def _with_sides(main: T.StructType, sides: list[tuple[str, T.StructType]]) -> T.StructType:
    fields = list(main.fields) + [T.StructField(SIDE_COLUMN, T.IntegerType())]
    for j, (_, struct) in enumerate(sides):
        fields += [T.StructField(f"__ks_o{j}_{f.name}", f.dataType) for f in struct.fields]
    return T.StructType(fields)


def side_output(result: DataFrame, tag: Any) -> DataFrame:  # noqa: ANN401
    """The DataFrame of a side output of ``process(..., side_outputs=...)``'s result; with
    ``tag=None``, all outputs in one DataFrame (column ``side_output`` names the tag)."""
    sides = getattr(result, SIDE_OUTPUTS_ATTRIBUTE, None)
    tag_id = getattr(tag, "tag_id", tag)
    if sides is None or tag_id not in sides:
        raise StateUsageError(
            f"no side output {tag_id!r} on this DataFrame: call side_output on the DataFrame "
            f"process() returned, with a tag it declared ({sorted(k for k in sides or {} if k)})"
        )
    return sides[tag_id]


def _check_extensions(df: DataFrame) -> None:
    configured = df.sparkSession.conf.get(EXTENSIONS_KEY, "") or ""
    if EXTENSIONS_CLASS not in configured.split(","):
        raise StateUsageError(
            f"keyed functions need {EXTENSIONS_KEY}={EXTENSIONS_CLASS} on the SparkSession (a "
            "static setting): build the session with keyedstate.configure(SparkSession.builder)"
            f"; this session has {EXTENSIONS_KEY}={configured!r}"
        )


def function_name(function: Any) -> str:  # noqa: ANN401 - a user function
    """How the function is named in its state's declaration: its class, or for a plain callable
    given to ``map``, ``reduce``, ... the callable (``map(parse)``), not keyedstate's adapter."""
    named = getattr(function, "keyedstate_function_name", None)
    return str(named()) if callable(named) else type(function).__name__


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
    side_outputs: SideOutputs = None,
    uid: str | None = None,
    broadcast: Any = None,  # noqa: ANN401 - a keyed_stream.BroadcastStream
) -> DataFrame:
    """Checks everything that can be checked before the query starts, then plans it.
    ``broadcast``: the broadcast stream a ``KeyedBroadcastProcessFunction`` is connected to."""
    if uid is not None and (not isinstance(uid, str) or not uid.strip()):
        raise StateUsageError(f"uid must be a non-empty string, got {uid!r}")
    if not isinstance(df, DataFrame) and type(df).__name__ != "DataFrame":
        raise TypeError(f"key_by needs a DataFrame, got {type(df).__name__}")
    if not df.isStreaming:
        raise StateUsageError(
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
    broadcast_df = None if broadcast is None else broadcast.df
    if broadcast_df is not None and (
        is_connect(broadcast_df) != is_connect(df) or not broadcast_df.isStreaming
    ):
        raise StateUsageError(
            "keyedstate.broadcast() takes a streaming DataFrame of the keyed stream's session"
        )
    columns = df.schema.names + ([] if broadcast_df is None else broadcast_df.schema.names)
    # connect()'s generated key of a stream that is not keyed is the one input column allowed.
    reserved = [
        c for c in columns if c.startswith("__ks_") and list(key_columns) != [SPREAD_COLUMN]
    ]
    if reserved:
        raise StateUsageError(f"input column names starting with '__ks_' are reserved: {reserved}")
    for column in [*key_columns, *([order_by] if order_by else [])]:
        if column not in columns:
            raise StateUsageError(f"no column {column!r} in the input; columns are {columns}")
    for column in key_columns:
        key_type = df.schema[column].dataType
        unkeyable = _unkeyable(key_type)
        if unkeyable:
            raise StateUsageError(
                f"key column {column!r} is {key_type.simpleString()}; {unkeyable} cannot be a key "
                "(Spark cannot group or sort by it)"
            )
        collations = _non_binary_collations(key_type)
        if collations:
            raise StateUsageError(
                f"key column {column!r} is {key_type.simpleString()}: strings of collation "
                f"{', '.join(collations)} can be equal with different bytes, and state keeps one "
                "key per byte form; key by a UTF8_BINARY string instead, for example "
                f"F.lower({column!r}).cast('string collate UTF8_BINARY') for a case-insensitive key"
            )
    if order_by is not None:
        data_type = df.schema[order_by].dataType
        if not isinstance(data_type, _ORDERABLE):
            raise StateUsageError(
                f"order_by column {order_by!r} is {data_type.simpleString()}, which cannot be "
                "ordered; use a number, string, date or timestamp column"
            )
    if output_mode not in ("append", "update"):
        raise StateUsageError(f"output_mode must be 'append' or 'update', got {output_mode!r}")
    _check_extensions(df)

    event_time = watermark_column(df)
    if timer_mode == "auto":
        base = KeyedProcessFunction if broadcast is None else KeyedBroadcastProcessFunction
        if kind == "process" and _overrides(function, "on_timer", base):
            timer_mode = "processing" if event_time is None else "auto"
        else:
            timer_mode = "none"
    elif timer_mode not in TIMER_MODES:
        raise StateUsageError(
            f"timer_mode must be 'auto', 'none', 'event' or 'processing', got {timer_mode!r}"
        )
    if timer_mode == "event" and event_time is None:
        raise StateUsageError(
            "timer_mode='event' needs an event-time watermark: call "
            "df.withWatermark('<timestamp column>', '<delay>') before key_by"
        )
    if timer_mode != "none" and kind != "process":
        raise StateUsageError("timers are only available to KeyedProcessFunction (process())")

    main_struct = output_struct(output_schema) if kind != "filter" else df.schema
    sides = _side_schemas(side_outputs)
    if sides and kind != "process":
        raise StateUsageError("side outputs are only available to KeyedProcessFunction (process())")
    struct = _with_sides(main_struct, sides) if sides else main_struct
    keyed, operator = _declared_states(function)
    if keyed and list(key_columns) == [SPREAD_COLUMN]:
        raise StateUsageError(
            f"a BroadcastProcessFunction has no keyed state, and {function_name(function)} "
            f"creates {[d.name for d in keyed]}: key the stream (keyedstate.key_by(...)"
            ".connect(...)) and use a KeyedBroadcastProcessFunction"
        )
    states = [StatePlan(i, d.name, d.kind, d) for i, d in enumerate(keyed)]
    states += [StatePlan(len(keyed) + i, d.name, kind, d) for i, (d, kind) in enumerate(operator)]
    broadcast_states = [] if broadcast is None else broadcast.descriptors
    visits_keyed_state = broadcast is not None and _mentions(function, "apply_to_keyed_state")
    states += [
        StatePlan(len(states) + i, d.name, BROADCAST, d) for i, d in enumerate(broadcast_states)
    ]
    names = [s.name for s in states]
    clashing = sorted({n for n in names if names.count(n) > 1})
    if clashing:
        raise StateUsageError(f"keyed, operator and broadcast states share the names {clashing}")
    queryable = [q for s in states if (q := s.descriptor.get_queryable_state_name()) is not None]
    clashing = sorted({q for q in queryable if queryable.count(q) > 1})
    if clashing:
        raise StateUsageError(f"several states are queryable under the names {clashing}")

    spark = df.sparkSession
    spec = {
        "nodeId": uuid.uuid4().hex,
        "uid": uid,
        "function": function_name(function),
        "keyColumns": list(key_columns),
        "orderBy": order_by,
        "states": [_state_json(s.descriptor, s.kind) for s in states],
        "timers": timer_mode != "none",
        "outputSchema": json.loads(struct.json()),
        "broadcastSchema": None if broadcast_df is None else json.loads(broadcast_df.schema.json()),
        # apply_to_keyed_state visits every key's state: the lookup sends them when it is used.
        "visitsKeyedState": visits_keyed_state,
    }
    spec_json = json.dumps(spec)
    out_schema = _out_schema(df, spec_json)
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
        side_tags={name: j for j, (name, _) in enumerate(sides)},
        side_columns=[list(st.names) for _, st in sides],
        main_width=len(main_struct.fields) if sides else None,
        broadcast_schema=None if broadcast_df is None else broadcast_df.schema,
        broadcast_event_time_column=(
            None if broadcast_df is None else watermark_column(broadcast_df)
        ),
        visits_keyed_state=visits_keyed_state,
    )
    runner = KeyedRunner(plan)
    try:
        lookup = _lookup(df, broadcast_df, spec_json)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # On Spark Connect this asks the server for the lookup's columns: it is planned here.
            mapped = lookup.mapInArrow(runner, out_schema)
    except Exception as error:  # noqa: BLE001 - py4j's and Connect's errors carry the JVM message
        raise StateUsageError(f"cannot plan {type(function).__name__}: {error}") from None
    result = _apply(mapped, spec_json, df.schema)
    if not sides:
        return result
    from pyspark.sql import functions as F

    main = result.where(F.col(SIDE_COLUMN).isNull()).select(
        *[F.col(_quoted(f.name)) for f in main_struct.fields]
    )
    side_frames = {
        name: result.where(F.col(SIDE_COLUMN) == j).select(
            *[F.col(_quoted(f"__ks_o{j}_{f.name}")).alias(f.name) for f in st.fields]
        )
        for j, (name, st) in enumerate(sides)
    }
    # All outputs of one run: the main output's columns, `side_output` (the tag's name, null for
    # the main output), and each side output's columns prefixed with its name.
    tag_name = F.lit(None).cast("string")
    for j, (name, _) in enumerate(sides):
        tag_name = F.when(F.col(SIDE_COLUMN) == j, F.lit(name)).otherwise(tag_name)
    combined = result.select(
        *[F.col(_quoted(f.name)) for f in main_struct.fields],
        tag_name.alias("side_output"),
        *[
            F.col(_quoted(f"__ks_o{j}_{f.name}")).alias(f"{name}.{f.name}")
            for j, (name, st) in enumerate(sides)
            for f in st.fields
        ],
    )
    setattr(main, SIDE_OUTPUTS_ATTRIBUTE, {**side_frames, None: combined})
    return main


# The plan's three JVM parts, through py4j in a classic session and as keyedstate's extension
# relations on Spark Connect (keyedstate.spark_connect.relations); the JVM builds the same nodes.


def _out_schema(df: DataFrame, spec_json: str) -> T.StructType:
    """The schema the keyed function's Python returns (``mapInArrow``'s)."""
    if is_connect(df):
        from keyedstate.spark_connect import relations

        return relations.out_schema(df, spec_json)
    engine = df.sparkSession._jvm.io.keyedstate.engine.KeyedProcess  # type: ignore[attr-defined]
    return T.StructType.fromJson(json.loads(engine.outSchemaJson(spec_json, df.schema.json())))


def _lookup(df: DataFrame, broadcast_df: DataFrame | None, spec_json: str) -> DataFrame:
    """The rows the keyed function's Python reads: ``df`` by key, with its state."""
    if is_connect(df):
        from keyedstate.spark_connect import relations

        return relations.lookup(df, broadcast_df, spec_json)
    spark = df.sparkSession
    engine = spark._jvm.io.keyedstate.engine.KeyedProcess  # type: ignore[attr-defined]
    jbroadcast = None if broadcast_df is None else broadcast_df._jdf
    return DataFrame(engine.lookup(df._jdf, jbroadcast, spec_json), spark)


def _apply(mapped: DataFrame, spec_json: str, input_schema: T.StructType) -> DataFrame:
    """The keyed function's outputs, its state changes applied and committed."""
    if is_connect(mapped):
        from keyedstate.spark_connect import relations

        return relations.apply(mapped, spec_json, input_schema)
    spark = mapped.sparkSession
    engine = spark._jvm.io.keyedstate.engine.KeyedProcess  # type: ignore[attr-defined]
    return DataFrame(engine.apply(mapped._jdf, spec_json, input_schema.json()), spark)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
