"""The engine's implementations of the contexts a function sees (``RuntimeContext``,
``KeyedProcessFunction.Context``, ``TimerService``, operator state)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from keyedstate.engine.keyed_state import KeyState
from keyedstate.functions import (
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    KeyedStateStore,
    OperatorStateStore,
    RuntimeContext,
    TimeDomain,
    TimerService,
)
from keyedstate.state.descriptors import (
    OPERATOR_LIST,
    OPERATOR_UNION_LIST,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateUsageError,
    ValueStateDescriptor,
)
from keyedstate.state.states import (
    AggregatingState,
    BroadcastState,
    ListState,
    MapState,
    ReadOnlyBroadcastState,
    ReducingState,
    ValueState,
)
from keyedstate.state.types import StateTypeError, checker

__all__ = [
    "BroadcastContextImpl",
    "ContextImpl",
    "RuntimeContextImpl",
    "TimerServiceImpl",
    "broadcast_views",
]


class TimerServiceImpl(TimerService):
    """Timers of the current key: registrations and deletions are kept per key and written to
    the timer column families when the key is done."""

    __slots__ = ("_b", "_mode")

    def __init__(self, backend: KeyState, mode: str) -> None:
        self._b = backend
        self._mode = mode

    def current_processing_time(self) -> int:
        return self._b.now

    def current_watermark(self) -> int:
        return self._b.watermark

    def _check(self, timestamp: object, event: bool) -> int:
        if isinstance(timestamp, bool) or not isinstance(timestamp, int):
            raise StateTypeError(f"timer timestamps are int milliseconds, got {timestamp!r}")
        if self._mode == "none":
            raise StateUsageError(
                "this query runs without timers (timer_mode='none'); define on_timer or pass "
                "timer_mode='event' or 'processing' to process()"
            )
        if not event and self._mode == "event":
            raise StateUsageError(
                "processing-time timers need timer_mode='processing' (or 'auto'); this query "
                "runs with timer_mode='event'"
            )
        return timestamp

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._b.timers[(False, self._check(timestamp, False))] = True

    def register_event_time_timer(self, timestamp: int) -> None:
        self._b.timers[(True, self._check(timestamp, True))] = True

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._b.timers[(False, timestamp)] = False

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._b.timers[(True, timestamp)] = False


class ContextImpl(
    KeyedProcessFunction.OnTimerContext, KeyedBroadcastProcessFunction.OnTimerContext
):
    """One object serves as Context and OnTimerContext, of a ``KeyedProcessFunction`` and of a
    ``KeyedBroadcastProcessFunction`` (its ReadOnlyContext); the runner sets ``ts`` and
    ``domain``, and ``broadcast`` (the read-only broadcast states by name)."""

    __slots__ = ("_b", "_timers", "_side", "ts", "domain", "broadcast")

    def __init__(self, backend: KeyState, timers: TimerService, side: Any = None) -> None:  # noqa: ANN401
        self._b = backend
        self._timers = timers
        self._side = side
        self.ts: int | None = None
        self.domain = TimeDomain.EVENT_TIME
        self.broadcast = BroadcastViews({})

    def current_processing_time(self) -> int:
        return self._b.now

    def current_watermark(self) -> int:
        return self._b.watermark

    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        return self.broadcast.of(state_descriptor)

    def timestamp(self) -> int | None:
        return self.ts

    def timer_service(self) -> TimerService:
        return self._timers

    def get_current_key(self) -> Any:  # noqa: ANN401
        return self._b.cur_key

    def time_domain(self) -> TimeDomain:
        return self.domain

    def output(self, output_tag: Any, value: Any) -> None:  # noqa: ANN401
        emit_side_output(self._side, output_tag, value)


def emit_side_output(side: Any, output_tag: Any, value: Any) -> None:  # noqa: ANN401
    """``ctx.output(tag, value)``: to the runner's side outputs, when ``process`` declared some."""
    if side is None:
        raise StateUsageError(
            f"side output {getattr(output_tag, 'tag_id', output_tag)!r} was not declared: "
            "pass side_outputs=[...] to process()"
        )
    side(output_tag, value)


class BroadcastViews:
    """A partition's broadcast states by name, found by descriptor as ``get_broadcast_state``
    does: it runs for every element, so each descriptor object is checked once (its name and
    its types against the declared state) and then found by identity."""

    __slots__ = ("_by_name", "_checked")

    def __init__(self, by_name: dict[str, Any]) -> None:
        self._by_name = by_name
        # id(descriptor) -> (descriptor, state): the descriptor is kept, so its id is not reused.
        self._checked: dict[int, tuple[Any, Any]] = {}

    def of(self, descriptor: MapStateDescriptor) -> Any:  # noqa: ANN401
        found = self._checked.get(id(descriptor))
        if found is not None and found[0] is descriptor:
            return found[1]
        state = self._by_name.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if state is None or not isinstance(descriptor, MapStateDescriptor):
            raise StateUsageError(
                f"no broadcast state {descriptor!r}: the broadcast stream connected to this "
                f"function declares {sorted(self._by_name) or 'none'} "
                "(keyedstate.broadcast(df, descriptor, ...))"
            )
        if state.descriptor.signature() != descriptor.signature():
            raise StateUsageError(
                f"broadcast state '{descriptor.name}' is declared as {state.descriptor!r}, not "
                f"{descriptor!r}"
            )
        if len(self._checked) < 16:  # a descriptor made per element is checked every time
            self._checked[id(descriptor)] = (descriptor, state)
        return state


class _ReadOnlyBroadcastState(ReadOnlyBroadcastState):
    """A broadcast state as ``process_element`` sees it: reads of the partition's map."""

    __slots__ = ("_map", "descriptor")

    def __init__(self, state: MapState, descriptor: MapStateDescriptor) -> None:
        self._map = state
        self.descriptor = descriptor

    def get(self, key: Any) -> Any:  # noqa: ANN401
        return self._map.get(key)

    def contains(self, key: Any) -> bool:  # noqa: ANN401
        return self._map.contains(key)

    def items(self) -> Iterable[tuple[Any, Any]]:
        return self._map.items()

    def keys(self) -> Iterable[Any]:
        return self._map.keys()

    def values(self) -> Iterable[Any]:
        return self._map.values()

    def is_empty(self) -> bool:
        return self._map.is_empty()

    def clear(self) -> None:
        raise StateUsageError(
            f"broadcast state '{self.descriptor.name}' is read-only in process_element and "
            "on_timer: write it in process_broadcast_element"
        )


class _BroadcastState(_ReadOnlyBroadcastState, BroadcastState):
    """A broadcast state as ``process_broadcast_element`` sees it: its writes are kept with the
    partition's operator state, the same writes in every partition."""

    __slots__ = ()

    def put(self, key: Any, value: Any) -> None:  # noqa: ANN401
        self._map.put(key, value)

    def put_all(self, dict_value: Mapping[Any, Any]) -> None:
        self._map.put_all(dict_value)

    def remove(self, key: Any) -> None:  # noqa: ANN401
        self._map.remove(key)

    def clear(self) -> None:
        self._map.clear()


class BroadcastContextImpl(KeyedBroadcastProcessFunction.Context):
    """The context of ``process_broadcast_element``: the broadcast states to write."""

    __slots__ = ("_b", "_side", "_visit", "states", "ts")

    def __init__(
        self,
        backend: KeyState,
        states: BroadcastViews,
        side: Any,  # noqa: ANN401
        visit: Callable[[Any, Callable[[Any, Any], None]], None],
    ) -> None:
        self._b = backend
        self._side = side
        self._visit = visit
        self.states = states
        # The broadcast element's event time in ms, if its stream has a watermark (the runner
        # sets it per element).
        self.ts: int | None = None

    def timestamp(self) -> int | None:
        return self.ts

    def current_processing_time(self) -> int:
        return self._b.now

    def current_watermark(self) -> int:
        return self._b.watermark

    def output(self, output_tag: Any, value: Any) -> None:  # noqa: ANN401
        emit_side_output(self._side, output_tag, value)

    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> BroadcastState:
        return self.states.of(state_descriptor)

    def apply_to_keyed_state(self, state_descriptor: Any, function: Any) -> None:  # noqa: ANN401
        self._visit(state_descriptor, function)


class _OperatorListState(ListState):
    """A list kept per partition (Flink's operator state of one parallel instance); ``kind`` is
    how it is redistributed on restore: ``operator_list`` (even split) or
    ``operator_union_list`` (union)."""

    __slots__ = ("_b", "_name", "_check", "descriptor", "kind")

    def __init__(self, backend: KeyState, descriptor: ListStateDescriptor, kind: str) -> None:
        self._b = backend
        self._name = descriptor.name
        self.descriptor = descriptor
        self.kind = kind
        self._check = checker(descriptor, descriptor.element_type_info, "element")

    def _element(self, value: Any) -> Any:  # noqa: ANN401
        if value is None:
            raise StateTypeError(f"operator ListState '{self._name}': cannot add None")
        return value if self._check is None else self._check.one(value)

    def get(self) -> list:
        return list(self._b.op_state.get(self._name, ()))

    def add(self, value: Any) -> None:  # noqa: ANN401
        self._b.op_state.setdefault(self._name, []).append(self._element(value))

    def add_all(self, values: Iterable[Any]) -> None:
        new = [self._element(v) for v in values]
        if new:
            self._b.op_state.setdefault(self._name, []).extend(new)

    def update(self, values: Iterable[Any]) -> None:
        self._b.op_state[self._name] = [self._element(v) for v in values]

    def clear(self) -> None:
        self._b.op_state[self._name] = []


class RuntimeContextImpl(RuntimeContext, FunctionInitializationContext, FunctionSnapshotContext):
    """The runtime context of one task (one state partition of one micro-batch); also the
    contexts of ``CheckpointedFunction``."""

    def __init__(self, backend: KeyState, task_name: str) -> None:
        self._b = backend
        self._task_name = task_name
        self.operator_states: dict[str, _OperatorListState] = {}
        self.batch_id = -1

    # KeyedStateStore
    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState:
        return self._b.register(state_descriptor, ValueStateDescriptor.kind)  # type: ignore[return-value]

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return self._b.register(state_descriptor, ListStateDescriptor.kind)  # type: ignore[return-value]

    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState:
        return self._b.register(state_descriptor, MapStateDescriptor.kind)  # type: ignore[return-value]

    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState:
        return self._b.register(state_descriptor, ReducingStateDescriptor.kind)  # type: ignore[return-value]

    def get_aggregating_state(
        self, state_descriptor: AggregatingStateDescriptor
    ) -> AggregatingState:
        return self._b.register(state_descriptor, AggregatingStateDescriptor.kind)  # type: ignore[return-value]

    # RuntimeContext
    def get_index_of_this_subtask(self) -> int:
        return self._b.partition

    def get_number_of_parallel_subtasks(self) -> int:
        return self._b.num_partitions

    def get_task_name(self) -> str:
        return self._task_name

    def get_attempt_number(self) -> int:
        try:
            from pyspark import TaskContext

            context = TaskContext.get()
            return context.attemptNumber() if context is not None else 0
        except Exception:  # noqa: BLE001 - outside a task
            return 0

    def get_operator_list_state(
        self, state_descriptor: ListStateDescriptor, kind: str = OPERATOR_LIST
    ) -> ListState:
        if not isinstance(state_descriptor, ListStateDescriptor):
            raise StateUsageError("operator state needs a ListStateDescriptor")
        handle = self.operator_states.get(state_descriptor.name)
        if handle is None:
            handle = _OperatorListState(self._b, state_descriptor, kind)
            self.operator_states[state_descriptor.name] = handle
        elif handle.kind != kind:
            # Flink refuses it too ("incompatible assignment mode"): one name, one redistribution.
            methods = {OPERATOR_LIST: "get_list_state", OPERATOR_UNION_LIST: "get_union_list_state"}
            raise StateUsageError(
                f"operator state '{state_descriptor.name}' was created with "
                f"{methods[handle.kind]}() and is now asked for with {methods[kind]}(): a state "
                "is redistributed one way (even split or union); use one method for it"
            )
        return handle

    # FunctionInitializationContext
    def is_restored(self) -> bool:
        return self._b.restored

    def get_operator_state_store(self) -> OperatorStateStore:
        return _OperatorStore(self)

    def get_keyed_state_store(self) -> KeyedStateStore:
        return self

    # FunctionSnapshotContext
    def get_checkpoint_id(self) -> int:
        return self.batch_id

    def get_checkpoint_timestamp(self) -> int:
        return self._b.now


class _OperatorStore(OperatorStateStore):
    __slots__ = ("_context",)

    def __init__(self, context: RuntimeContextImpl) -> None:
        self._context = context

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return self._context.get_operator_list_state(state_descriptor, OPERATOR_LIST)

    def get_union_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return self._context.get_operator_list_state(state_descriptor, OPERATOR_UNION_LIST)


def broadcast_views(
    backend: KeyState, descriptors: list[MapStateDescriptor]
) -> tuple[BroadcastViews, BroadcastViews]:
    """The broadcast states of a partition (kept in ``backend``, whose one "key" is the
    partition), read-only for ``process_element`` and writable for ``process_broadcast_element``."""
    maps = {d.name: backend.register(d, MapStateDescriptor.kind) for d in descriptors}
    read_only = {n: _ReadOnlyBroadcastState(m, m.descriptor) for n, m in maps.items()}  # type: ignore[arg-type]
    writable = {n: _BroadcastState(m, m.descriptor) for n, m in maps.items()}  # type: ignore[arg-type]
    return BroadcastViews(read_only), BroadcastViews(writable)
