"""The entry point: ``keyedstate.key_by(df, "user_id").process(MyFunction(), output_schema)``.

Every method returns a streaming DataFrame; write it with ``writeStream`` as usual (output mode
``append``, or ``update`` with ``output_mode="update"``).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame

from keyedstate.elements import element_class
from keyedstate.functions import (
    BroadcastProcessFunction,
    CheckpointedFunction,
    FilterFunction,
    FlatMapFunction,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    MapFunction,
    OutputTag,
    ReduceFunction,
    RuntimeContext,
)
from keyedstate.state.descriptors import (
    MapStateDescriptor,
    StateUsageError,
    ValueStateDescriptor,
)
from keyedstate.state.states import ValueState
from keyedstate.state.types import Types, to_type_info

__all__ = [
    "BroadcastConnectedStream",
    "BroadcastStream",
    "KeyedStream",
    "broadcast",
    "connect",
    "key_by",
    "side_output",
]


def side_output(result: DataFrame, tag: OutputTag | str | None) -> DataFrame:
    """The DataFrame of side output ``tag`` of a ``process(..., side_outputs=...)`` result
    (PyFlink's ``get_side_output``).

    The main and side DataFrames are filters of one output: a query that writes one of them runs
    the keyed function under its own checkpoint. To write every output from one query, take
    ``side_output(result, None)``: all rows, with ``side_output`` naming the tag (null for the
    main output) and each side output's columns as ``<tag>.<column>``, for ``foreachBatch``.
    """
    from keyedstate.engine import planner  # the API layer loads the engine only when used

    return planner.side_output(result, tag)


WITH_STATE_NAME = "withState"


def broadcast(df: DataFrame, *descriptors: MapStateDescriptor) -> BroadcastStream:
    """A streaming DataFrame to broadcast to every state partition of a keyed function it is
    connected to (``key_by(...).connect(broadcast(rules, descriptor))``), with the broadcast
    states (``MapStateDescriptor``s) its elements are kept in: Flink's
    ``stream.broadcast(descriptor)``."""
    if not descriptors:
        raise StateUsageError(
            "broadcast() needs at least one MapStateDescriptor: the broadcast states"
        )
    for d in descriptors:
        if not isinstance(d, MapStateDescriptor):
            raise StateUsageError(
                f"a broadcast state is a map: broadcast() takes MapStateDescriptors, got {d!r}"
            )
        if d.ttl_config is not None:
            raise StateUsageError(
                f"broadcast state '{d.name}' has a TTL: broadcast state has none (as in Flink)"
            )
    names = [d.name for d in descriptors]
    if len(set(names)) != len(names):
        raise StateUsageError(f"broadcast states need distinct names, got {names}")
    return BroadcastStream(df, list(descriptors))


def connect(df: DataFrame, broadcast_stream: BroadcastStream) -> BroadcastConnectedStream:
    """A stream that is not keyed connected to a broadcast stream, for a
    ``BroadcastProcessFunction`` (Flink's ``data_stream.connect(broadcast_stream)``). Its
    elements are spread over the state partitions at random (by a generated key, in no particular
    order within a partition), each of which holds the broadcast state."""
    if not isinstance(broadcast_stream, BroadcastStream):
        raise StateUsageError(
            "connect() takes a keyedstate.broadcast(df, descriptor) stream, got "
            f"{type(broadcast_stream).__name__}"
        )
    from pyspark.sql import functions as F

    # Random: no keyed state depends on where an element goes (Spark refuses row ids in streams).
    key = F.floor(F.rand() * SPREAD_KEYS).cast("int")
    spread = df.withColumn(SPREAD_COLUMN, key)
    return BroadcastConnectedStream(KeyedStream(spread, [SPREAD_COLUMN], None), broadcast_stream)


# The generated key of a stream connect() spreads: elements of a non-keyed function go to any
# partition (no keyed state depends on it), about evenly.
SPREAD_COLUMN = "__ks_spread"
SPREAD_KEYS = 4096


class BroadcastStream:
    """A stream broadcast with its broadcast states (``keyedstate.broadcast``)."""

    def __init__(self, df: DataFrame, descriptors: list[MapStateDescriptor]) -> None:
        self.df = df
        self.descriptors = descriptors


class BroadcastConnectedStream:
    """A keyed stream connected to a broadcast stream (``KeyedStream.connect``)."""

    def __init__(self, keyed: KeyedStream, broadcast_stream: BroadcastStream) -> None:
        self._keyed = keyed
        self._broadcast = broadcast_stream

    def process(
        self,
        function: KeyedBroadcastProcessFunction,
        output_schema: Any,  # noqa: ANN401
        *,
        timer_mode: str = "auto",
        output_mode: str = "append",
        side_outputs: Mapping[OutputTag, Any] | Sequence[OutputTag] | None = None,
        uid: str | None = None,
    ) -> DataFrame:
        """Run a :class:`KeyedBroadcastProcessFunction` (options: ``KeyedStream.process``'s)."""
        spread = self._keyed.key_columns == [SPREAD_COLUMN]
        if spread:
            if not isinstance(function, BroadcastProcessFunction):
                raise StateUsageError(
                    "a stream connected to a broadcast stream by keyedstate.connect runs a "
                    f"BroadcastProcessFunction, got {type(function).__name__}"
                )
            checkpointed = isinstance(function, CheckpointedFunction)
            adapter = _NonKeyedCheckpointed if checkpointed else _NonKeyed
            function = adapter(function, self._keyed._df.columns[:-1])  # type: ignore[assignment]
            timer_mode = "none"
        elif not isinstance(function, KeyedBroadcastProcessFunction):
            raise StateUsageError(
                "a keyed stream connected to a broadcast stream runs a "
                f"KeyedBroadcastProcessFunction, got {type(function).__name__}"
            )
        return self._keyed._build(
            "process",
            function,
            output_schema,
            timer_mode=timer_mode,
            output_mode=output_mode,
            side_outputs=side_outputs,
            uid=uid,
            broadcast=self._broadcast,
        )


def key_by(
    df: DataFrame,
    *key_columns: str | Sequence[str],
    order_by: str | None = None,
) -> KeyedStream:
    """Key a streaming DataFrame by one or more columns.

    Each key's state is stored per state variable in the query's state store (Spark's shuffle
    partitions are the parallel instances). ``order_by`` names a column by which each key's
    elements of a micro-batch are processed; without it, the order within a key is the order
    Spark's shuffle delivers, which is not stable across retries.
    """
    names: list[str] = []
    for column in key_columns:
        if isinstance(column, str):
            names.append(column)
        elif isinstance(column, Sequence):
            names.extend(column)
        else:
            raise TypeError(f"key columns are names (str), got {column!r}")
    if not names:
        raise StateUsageError("key_by needs at least one key column")
    return KeyedStream(df, names, order_by)


class KeyedStream:
    """A DataFrame partitioned by key, ready for a stateful function."""

    def __init__(self, df: DataFrame, key_columns: list[str], order_by: str | None) -> None:
        self._df = df
        self.key_columns = key_columns
        self.order_by = order_by

    def _build(
        self,
        kind: str,
        function: Any,  # noqa: ANN401
        output_schema: Any | None,
        **options: Any,  # noqa: ANN401
    ) -> DataFrame:
        from keyedstate.engine import planner  # the API layer loads the engine only when used

        return planner.build(
            self._df,
            self.key_columns,
            kind,
            function,
            output_schema if output_schema is not None else self._df.schema,
            order_by=self.order_by,
            **options,
        )

    def connect(self, broadcast_stream: BroadcastStream) -> BroadcastConnectedStream:
        """Connects a broadcast stream (``keyedstate.broadcast``): its elements reach every state
        partition before the keyed elements of the same micro-batch."""
        if not isinstance(broadcast_stream, BroadcastStream):
            raise StateUsageError(
                "connect() takes a keyedstate.broadcast(df, descriptor) stream, got "
                f"{type(broadcast_stream).__name__}"
            )
        return BroadcastConnectedStream(self, broadcast_stream)

    def process(
        self,
        function: KeyedProcessFunction,
        output_schema: Any,
        *,
        timer_mode: str = "auto",
        output_mode: str = "append",
        side_outputs: Mapping[OutputTag, Any] | Sequence[OutputTag] | None = None,
        uid: str | None = None,
    ) -> DataFrame:
        """Run a :class:`KeyedProcessFunction`.

        ``timer_mode``: ``"auto"`` (default: timers when the function defines ``on_timer``),
        ``"none"`` (timers refused), ``"event"`` (event-time timers only; needs a watermark) or
        ``"processing"`` (both kinds). ``side_outputs``: the ``OutputTag``s the function emits
        to with ``ctx.output(tag, value)``, each with its schema (``{tag: schema}``) or typed
        (``OutputTag("late", Types.ROW_NAMED(...))``); ``keyedstate.side_output(result, tag)``
        is the DataFrame of one.

        ``uid`` (every method takes it): the operator's name, Flink's ``uid``. It is kept with the
        function's state: tools find the operator by it (``keyedstate.state.read(spark, path,
        uid)``, ``inspect``) and a run that puts another function at its place is refused.
        """
        return self._build(
            "process",
            function,
            output_schema,
            timer_mode=timer_mode,
            output_mode=output_mode,
            side_outputs=side_outputs,
            uid=uid,
        )

    def map(
        self,
        function: MapFunction | Callable[[Any], Any],
        output_schema: Any,
        *,
        output_mode: str = "append",
        uid: str | None = None,
    ) -> DataFrame:
        """One output per element (a :class:`RichMapFunction` or a plain callable)."""
        if not isinstance(function, MapFunction) and callable(function):
            function = _CallableMap(function)
        return self._build("map", function, output_schema, output_mode=output_mode, uid=uid)

    def flat_map(
        self,
        function: FlatMapFunction | Callable[[Any], Iterable[Any] | None],
        output_schema: Any,
        *,
        output_mode: str = "append",
        uid: str | None = None,
    ) -> DataFrame:
        """Any number of outputs per element (a :class:`RichFlatMapFunction` or a callable)."""
        if not hasattr(function, "flat_map") and callable(function):
            function = _CallableFlatMap(function)
        return self._build("flat_map", function, output_schema, output_mode=output_mode, uid=uid)

    def filter(
        self,
        function: FilterFunction | Callable[[Any], bool],
        *,
        output_mode: str = "append",
        uid: str | None = None,
    ) -> DataFrame:
        """The elements for which the function returns True (same columns as the input)."""
        if not isinstance(function, FilterFunction) and callable(function):
            function = _CallableFilter(function)
        return self._build("filter", function, None, output_mode=output_mode, uid=uid)

    def reduce(
        self,
        function: ReduceFunction | Callable[[Any, Any], Any],
        *,
        output_mode: str = "append",
        uid: str | None = None,
    ) -> DataFrame:
        """Flink's rolling reduce: per element, the reduction of the key's elements so far
        (outputs have the input's columns; both arguments of ``reduce(a, b)`` are rows of the
        input, and it returns one as a tuple or a row)."""
        return self._build(
            "map",
            _RunningReduce(function, tuple(self._df.schema.names)),
            self._df.schema,
            output_mode=output_mode,
            uid=uid,
        )

    def map_with_state(
        self,
        fun: Callable[[Any, Any], tuple[Any, Any]],
        output_schema: Any,
        state_type: Any = None,  # noqa: ANN401
        *,
        output_mode: str = "append",
        uid: str | None = None,
    ) -> DataFrame:
        """Flink Scala's ``mapWithState``: ``fun(value, state_or_None) -> (output, new_state)``;
        a ``None`` new state clears it. The state type is ``state_type`` or the annotation of
        ``fun``'s second parameter (``count: int | None``); without either, any picklable value.
        """
        state_fn = _MapWithState(fun, state_type)
        return self._build("map", state_fn, output_schema, output_mode=output_mode, uid=uid)

    def flat_map_with_state(
        self,
        fun: Callable[[Any, Any], tuple[Iterable[Any] | None, Any]],
        output_schema: Any,
        state_type: Any = None,  # noqa: ANN401
        *,
        output_mode: str = "append",
        uid: str | None = None,
    ) -> DataFrame:
        """``fun(value, state_or_None) -> (outputs, new_state)``."""
        state_fn = _FlatMapWithState(fun, state_type)
        return self._build("flat_map", state_fn, output_schema, output_mode=output_mode, uid=uid)

    def filter_with_state(
        self,
        fun: Callable[[Any, Any], tuple[bool, Any]],
        state_type: Any = None,  # noqa: ANN401
        *,
        output_mode: str = "append",
        uid: str | None = None,
    ) -> DataFrame:
        """``fun(value, state_or_None) -> (keep, new_state)``."""
        state_fn = _FilterWithState(fun, state_type)
        return self._build("filter", state_fn, None, output_mode=output_mode, uid=uid)


# ---------------------------------------------------------------------------------------------
# Adapters (module level, so executors import them instead of unpickling them by value)


def _state_type(fun: Callable[..., Any], declared: Any) -> Any:  # noqa: ANN401
    if not callable(fun):
        raise TypeError(f"expected a function (value, state) -> (...), got {fun!r}")
    if declared is not None:
        return to_type_info(declared)
    try:
        parameters = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return Types.PICKLED_BYTE_ARRAY()
    if len(parameters) < 2:
        raise TypeError(
            f"{getattr(fun, '__name__', fun)!r} must take (value, state), "
            f"it takes {len(parameters)} parameter(s)"
        )
    try:
        hints = typing.get_type_hints(fun)
    except Exception:  # noqa: BLE001 - unresolvable annotations
        hints = {}
    hint = hints.get(parameters[1].name)
    return Types.PICKLED_BYTE_ARRAY() if hint is None else to_type_info(hint)


def _callable_name(fun: Any) -> str:  # noqa: ANN401
    """A user callable as a function's name: its qualified name (``<lambda>`` for a lambda)."""
    return str(getattr(fun, "__qualname__", type(fun).__name__))


class _Adapter:
    """Wraps a user callable; the keyed function's name is the callable's, not the adapter's
    (kept with the state: `docs/python-api.md`, "uid")."""

    fun: Callable[..., Any]
    verb = ""

    def keyedstate_function_name(self) -> str:
        return f"{self.verb}({_callable_name(self.fun)})"


class _CallableMap(_Adapter, MapFunction):
    verb = "map"

    def __init__(self, fun: Callable[[Any], Any]) -> None:
        self.fun = fun

    def map(self, value: Any) -> Any:  # noqa: ANN401
        return self.fun(value)


class _CallableFlatMap(_Adapter, FlatMapFunction):
    verb = "flat_map"

    def __init__(self, fun: Callable[[Any], Iterable[Any] | None]) -> None:
        self.fun = fun

    def flat_map(self, value: Any) -> Iterable[Any] | None:  # noqa: ANN401
        return self.fun(value)


class _CallableFilter(_Adapter, FilterFunction):
    verb = "filter"

    def __init__(self, fun: Callable[[Any], bool]) -> None:
        self.fun = fun

    def filter(self, value: Any) -> bool:  # noqa: ANN401
        return bool(self.fun(value))


class _WithState(_Adapter):
    """``fun(value, state_or_None) -> (result, new_state)`` on a ValueState of ``declared`` (or
    the type ``_state_type`` finds); ``_apply`` runs it and keeps the new state."""

    state: ValueState

    def __init__(self, fun: Callable[..., Any], declared: Any) -> None:  # noqa: ANN401
        self.state_type = _state_type(fun, declared)
        self.fun = fun

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(
            ValueStateDescriptor(WITH_STATE_NAME, self.state_type)
        )

    def _apply(self, value: Any) -> Any:  # noqa: ANN401
        state = self.state
        result, new_state = self.fun(value, state.value())
        state.update(new_state)
        return result


class _MapWithState(_WithState, MapFunction):
    verb = "map_with_state"
    map = _WithState._apply  # the method itself: no extra call per element


class _FlatMapWithState(_WithState, FlatMapFunction):
    verb = "flat_map_with_state"
    flat_map = _WithState._apply


class _FilterWithState(_WithState, FilterFunction):
    verb = "filter_with_state"

    def filter(self, value: Any) -> bool:  # noqa: ANN401
        return bool(self._apply(value))


class _RunningReduce(MapFunction):
    state: ValueState

    def keyedstate_function_name(self) -> str:
        return f"reduce({_callable_name(self.reduce_fn)})"

    def __init__(
        self, function: ReduceFunction | Callable[[Any, Any], Any], names: tuple[str, ...]
    ) -> None:
        reduce = getattr(function, "reduce", None)
        self.reduce_fn = reduce if callable(reduce) else function
        if not callable(self.reduce_fn):
            raise TypeError("reduce() needs a ReduceFunction or a callable (a, b) -> c")
        self.names = names

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("reduce"))

    def map(self, value: Any) -> Any:  # noqa: ANN401
        current = self.state.value()
        if current is None:
            result = value
        else:
            # Both arguments are rows of the input (Flink's ReduceFunction<T>).
            row = element_class(self.names)._make(current)
            result = element_class(self.names)._make(tuple(self.reduce_fn(row, value)))
        self.state.update(tuple(result))
        return result


class _NonKeyed(KeyedBroadcastProcessFunction):
    """A ``BroadcastProcessFunction`` run as a keyed one over the generated key of
    ``connect``: its elements without that column, no keyed state."""

    def __init__(self, function: BroadcastProcessFunction, columns: list[str]) -> None:
        self.function = function
        self.columns = tuple(columns)
        self._element: Any = None

    def keyedstate_function_name(self) -> str:
        return type(self.function).__name__

    def open(self, runtime_context: RuntimeContext) -> None:
        self.function.open(runtime_context)
        self._element = element_class(self.columns)

    def close(self) -> None:
        self.function.close()

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        return self.function.process_broadcast_element(value, ctx)

    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        return self.function.process_element(tuple.__new__(self._element, value[:-1]), ctx)


class _NonKeyedCheckpointed(_NonKeyed, CheckpointedFunction):
    """A ``BroadcastProcessFunction`` that is also a ``CheckpointedFunction``: its operator
    state."""

    def initialize_state(self, context: Any) -> None:  # noqa: ANN401
        self.function.initialize_state(context)  # type: ignore[attr-defined]

    def snapshot_state(self, context: Any) -> None:  # noqa: ANN401
        self.function.snapshot_state(context)  # type: ignore[attr-defined]
