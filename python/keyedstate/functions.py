"""User functions and their contexts, named as in PyFlink (``pyflink.datastream.functions``).

A function object is shipped to the executors with the query. ``open(runtime_context)`` runs
once per Spark task (one partition of one micro-batch) before the first element; state objects
obtained there stay bound to whatever key is being processed. See docs/python-api.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from keyedstate.state.descriptors import (
    AggregatingStateDescriptor,
    KeyedStateError,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from keyedstate.state.states import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    _checker,
)
from keyedstate.state.types import StateTypeError

if TYPE_CHECKING:
    from keyedstate.state.backend import KeyedStateBackend

__all__ = [
    "AggregateFunction",
    "CheckpointedFunction",
    "FilterFunction",
    "FlatMapFunction",
    "Function",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "KeyedProcessFunction",
    "KeyedStateStore",
    "MapFunction",
    "OperatorStateStore",
    "ReduceFunction",
    "RichFilterFunction",
    "RichFlatMapFunction",
    "RichFunction",
    "RichMapFunction",
    "RuntimeContext",
    "TimeDomain",
    "TimerService",
]

IN = TypeVar("IN")
OUT = TypeVar("OUT")
ACC = TypeVar("ACC")
T = TypeVar("T")


class TimeDomain(Enum):
    """Whether a timer fired on event time or on processing time."""

    EVENT_TIME = 0
    PROCESSING_TIME = 1


class TimerService(ABC):
    """Timers of the current key and the current times (milliseconds since the epoch)."""

    @abstractmethod
    def current_processing_time(self) -> int:
        """The processing time of the current micro-batch (constant within it)."""

    @abstractmethod
    def current_watermark(self) -> int:
        """The event-time watermark of the current micro-batch (``-2**63`` without one)."""

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None: ...


class KeyedStateStore(ABC):
    """Where keyed state objects come from (``RuntimeContext`` is one)."""

    @abstractmethod
    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState: ...

    @abstractmethod
    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState: ...

    @abstractmethod
    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState: ...

    @abstractmethod
    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState: ...

    @abstractmethod
    def get_aggregating_state(
        self, state_descriptor: AggregatingStateDescriptor
    ) -> AggregatingState: ...


class RuntimeContext(KeyedStateStore):
    """What ``open`` gets: keyed state, and where the function runs.

    A "parallel subtask" is a bucket of keys (``key_by(..., buckets=n)``): operator state and
    these indexes are per bucket, like Flink's per parallel instance.
    """

    @abstractmethod
    def get_index_of_this_subtask(self) -> int:
        """The bucket being processed (changes between buckets within one Spark task)."""

    @abstractmethod
    def get_number_of_parallel_subtasks(self) -> int:
        """The number of buckets."""

    def get_max_number_of_parallel_subtasks(self) -> int:
        return self.get_number_of_parallel_subtasks()

    @abstractmethod
    def get_task_name(self) -> str: ...

    def get_task_name_with_subtasks(self) -> str:
        index = self.get_index_of_this_subtask()
        return f"{self.get_task_name()} ({index + 1}/{self.get_number_of_parallel_subtasks()})"

    @abstractmethod
    def get_attempt_number(self) -> int: ...


class Function(ABC):  # noqa: B024 - every method is optional
    """Base of all user functions: ``open`` and ``close`` are optional."""

    def open(self, runtime_context: RuntimeContext) -> None:  # noqa: B027
        """Called once per Spark task before the first element (create state objects here)."""

    def close(self) -> None:  # noqa: B027
        """Kept for compatibility: the engine does not call it (a task's end is not visible to
        the function)."""


RichFunction = Function


class MapFunction(Function, Generic[IN, OUT]):
    @abstractmethod
    def map(self, value: IN) -> OUT:
        """One output per element."""


class FlatMapFunction(Function, Generic[IN, OUT]):
    @abstractmethod
    def flat_map(self, value: IN) -> Iterable[OUT] | None:
        """Any number of outputs per element (yield them, or return an iterable)."""


class FilterFunction(Function, Generic[IN]):
    @abstractmethod
    def filter(self, value: IN) -> bool:
        """Whether the element is kept."""


RichMapFunction = MapFunction
RichFlatMapFunction = FlatMapFunction
RichFilterFunction = FilterFunction


class ReduceFunction(Function, Generic[T]):
    @abstractmethod
    def reduce(self, value1: T, value2: T) -> T:
        """Combines two values of the same type."""


class AggregateFunction(Function, Generic[IN, ACC, OUT]):
    """``create_accumulator``/``add``/``get_result``: inputs and result may differ in type."""

    @abstractmethod
    def create_accumulator(self) -> ACC: ...

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC:
        """Folds the value into the accumulator and returns the (new) accumulator."""

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT: ...

    def merge(self, acc_a: ACC, acc_b: ACC) -> ACC:
        raise NotImplementedError("merge is not used by keyed AggregatingState")


class KeyedProcessFunction(Function, Generic[IN, OUT]):
    """Processes each element of a keyed stream, with keyed state and per-key timers.

    ``process_element`` and ``on_timer`` yield outputs (or return an iterable, or None).
    """

    class Context(ABC):
        @abstractmethod
        def timestamp(self) -> int | None:
            """The element's event time (ms) when the input has a watermark column, the timer's
            time in ``on_timer``, else None."""

        @abstractmethod
        def timer_service(self) -> TimerService: ...

        @abstractmethod
        def get_current_key(self) -> Any:  # noqa: ANN401 - the key's Python value
            """The current key: a value for one key column, a tuple for several."""

    class OnTimerContext(Context):
        @abstractmethod
        def time_domain(self) -> TimeDomain: ...

    @abstractmethod
    def process_element(
        self, value: IN, ctx: KeyedProcessFunction.Context
    ) -> Iterable[OUT] | None: ...

    def on_timer(
        self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
    ) -> Iterable[OUT] | None:
        """Called when a timer of the current key fires."""
        return None


# ---------------------------------------------------------------------------------------------
# Operator state (CheckpointedFunction)


class OperatorStateStore(ABC):
    """Per-bucket ("per parallel instance") list state."""

    @abstractmethod
    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState: ...

    def get_union_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """The same as ``get_list_state``: buckets never change, so nothing is redistributed."""
        return self.get_list_state(state_descriptor)


class FunctionInitializationContext(ABC):
    @abstractmethod
    def is_restored(self) -> bool:
        """Whether this bucket had stored state before this invocation."""

    @abstractmethod
    def get_operator_state_store(self) -> OperatorStateStore: ...

    @abstractmethod
    def get_keyed_state_store(self) -> KeyedStateStore: ...


class FunctionSnapshotContext(ABC):
    @abstractmethod
    def get_checkpoint_id(self) -> int:
        """The micro-batch being committed (-1 when unknown)."""

    @abstractmethod
    def get_checkpoint_timestamp(self) -> int:
        """The micro-batch's processing time."""


class CheckpointedFunction(ABC):
    """Mix-in for functions with operator state (Flink's ``CheckpointedFunction``).

    ``initialize_state`` runs before a bucket's elements are processed (``is_restored()`` tells
    whether the bucket had state) and ``snapshot_state`` after them, before the bucket's state is
    handed to Spark for the micro-batch's commit.
    """

    @abstractmethod
    def initialize_state(self, context: FunctionInitializationContext) -> None: ...

    @abstractmethod
    def snapshot_state(self, context: FunctionSnapshotContext) -> None: ...


# ---------------------------------------------------------------------------------------------
# Implementations used by the engine

TIMER_MODES = ("none", "event", "processing")


class _TimerServiceImpl(TimerService):
    __slots__ = ("_b", "_mode")

    def __init__(self, backend: KeyedStateBackend, mode: str) -> None:
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
            raise KeyedStateError(
                "this query runs without timers (timer_mode='none'); define on_timer or pass "
                "timer_mode='event' or 'processing' to process()"
            )
        if not event and self._mode != "processing":
            raise KeyedStateError(
                "processing-time timers need timer_mode='processing'; this query runs with "
                f"timer_mode='{self._mode}' (event-time timeouts in Spark)"
            )
        return timestamp

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._b.register_timer(False, self._check(timestamp, False))

    def register_event_time_timer(self, timestamp: int) -> None:
        self._b.register_timer(True, self._check(timestamp, True))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._b.delete_timer(False, timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._b.delete_timer(True, timestamp)


class _ContextImpl(KeyedProcessFunction.OnTimerContext):
    """One object serves as Context and OnTimerContext; the engine sets ``ts`` and ``domain``."""

    __slots__ = ("_b", "_timers", "ts", "domain")

    def __init__(self, backend: KeyedStateBackend, timers: TimerService) -> None:
        self._b = backend
        self._timers = timers
        self.ts: int | None = None
        self.domain = TimeDomain.EVENT_TIME

    def timestamp(self) -> int | None:
        return self.ts

    def timer_service(self) -> TimerService:
        return self._timers

    def get_current_key(self) -> Any:  # noqa: ANN401
        return self._b.cur_key

    def time_domain(self) -> TimeDomain:
        return self.domain


class _OperatorListState(ListState):
    """A list kept per bucket, outside any key."""

    __slots__ = ("_b", "_name", "_check")

    def __init__(self, backend: KeyedStateBackend, descriptor: ListStateDescriptor) -> None:
        self._b = backend
        self._name = descriptor.name
        self._check = _checker(descriptor, descriptor.element_type_info, "element")

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
        new = [self._element(v) for v in values]
        if new:
            self._b.op_state[self._name] = new
        else:
            self._b.op_state.pop(self._name, None)

    def clear(self) -> None:
        self._b.op_state.pop(self._name, None)


class _RuntimeContextImpl(RuntimeContext, FunctionInitializationContext, FunctionSnapshotContext):
    """The engine's runtime context; also the contexts of ``CheckpointedFunction``."""

    def __init__(self, backend: KeyedStateBackend, num_buckets: int, task_name: str) -> None:
        self._b = backend
        self._num_buckets = num_buckets
        self._task_name = task_name
        self._operator_states: dict[str, _OperatorListState] = {}
        self.batch_id = -1

    # KeyedStateStore
    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState:
        return self._b.register(state_descriptor, "value")  # type: ignore[return-value]

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return self._b.register(state_descriptor, "list")  # type: ignore[return-value]

    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState:
        return self._b.register(state_descriptor, "map")  # type: ignore[return-value]

    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState:
        return self._b.register(state_descriptor, "reducing")  # type: ignore[return-value]

    def get_aggregating_state(
        self, state_descriptor: AggregatingStateDescriptor
    ) -> AggregatingState:
        return self._b.register(state_descriptor, "aggregating")  # type: ignore[return-value]

    # RuntimeContext
    def get_index_of_this_subtask(self) -> int:
        return self._b.bucket_id

    def get_number_of_parallel_subtasks(self) -> int:
        return self._num_buckets

    def get_task_name(self) -> str:
        return self._task_name

    def get_attempt_number(self) -> int:
        try:
            from pyspark import TaskContext

            context = TaskContext.get()
            return context.attemptNumber() if context is not None else 0
        except Exception:  # noqa: BLE001 - outside a task
            return 0

    # Operator list state: one object per name, read through _OperatorStore
    def get_operator_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        if not isinstance(state_descriptor, ListStateDescriptor):
            raise KeyedStateError("operator state needs a ListStateDescriptor")
        handle = self._operator_states.get(state_descriptor.name)
        if handle is None:
            handle = _OperatorListState(self._b, state_descriptor)
            self._operator_states[state_descriptor.name] = handle
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

    def __init__(self, context: _RuntimeContextImpl) -> None:
        self._context = context

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return self._context.get_operator_list_state(state_descriptor)
