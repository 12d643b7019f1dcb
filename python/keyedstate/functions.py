"""User functions and their contexts, named as in PyFlink (``pyflink.datastream.functions``).

A function object is shipped to the executors with the query. ``open(runtime_context)`` runs
once per Spark task (one partition of one micro-batch) before the first element; state objects
obtained there stay bound to whatever key is being processed. See docs/python-api.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, Generic, TypeVar

from keyedstate.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from keyedstate.state.states import (
    AggregatingState,
    BroadcastState,
    ListState,
    MapState,
    ReadOnlyBroadcastState,
    ReducingState,
    State,
    ValueState,
)
from keyedstate.state.types import TypeInformation, to_type_info

__all__ = [
    "AggregateFunction",
    "BaseBroadcastProcessFunction",
    "BroadcastProcessFunction",
    "CheckpointedFunction",
    "FilterFunction",
    "FlatMapFunction",
    "Function",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "KeyedBroadcastProcessFunction",
    "KeyedProcessFunction",
    "KeyedStateStore",
    "MapFunction",
    "OperatorStateStore",
    "OutputTag",
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

    A "parallel subtask" is a state partition (Spark's shuffle partitions of the query): operator
    state and these indexes are per partition, like Flink's per parallel instance.
    """

    @abstractmethod
    def get_index_of_this_subtask(self) -> int:
        """The state partition this task processes."""

    @abstractmethod
    def get_number_of_parallel_subtasks(self) -> int:
        """The number of state partitions."""

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
        """Called once per Spark task after its last element and timer (also when it fails)."""


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


class OutputTag:
    """A side output of a ``KeyedProcessFunction``: ``ctx.output(tag, value)`` in the function,
    ``keyedstate.side_output(result, tag)`` for its DataFrame (PyFlink's ``OutputTag``)."""

    def __init__(self, tag_id: str, type_info: Any = None) -> None:  # noqa: ANN401
        if not isinstance(tag_id, str) or not tag_id:
            raise ValueError(f"an OutputTag needs a non-empty name, got {tag_id!r}")
        self.tag_id = tag_id
        self.type_info: TypeInformation | None = (
            None if type_info is None else to_type_info(type_info)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTag) and other.tag_id == self.tag_id

    def __hash__(self) -> int:
        return hash(self.tag_id)

    def __repr__(self) -> str:
        return f"OutputTag({self.tag_id!r})"


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

        @abstractmethod
        def output(self, output_tag: OutputTag, value: Any) -> None:  # noqa: ANN401
            """Emits ``value`` to the side output ``output_tag`` (declared in ``process``)."""

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
# Broadcast state (PyFlink's BaseBroadcastProcessFunction, KeyedBroadcastProcessFunction)


class BaseBroadcastProcessFunction(Function):
    """What both sides of a function on a broadcast-connected stream share: their contexts."""

    class BaseContext(ABC):
        @abstractmethod
        def timestamp(self) -> int | None:
            """The element's event time (ms) when its input has a watermark column, else None."""

        @abstractmethod
        def current_processing_time(self) -> int:
            """The micro-batch's processing time (ms)."""

        @abstractmethod
        def current_watermark(self) -> int:
            """The operator's event-time watermark (ms) in this micro-batch."""

        @abstractmethod
        def output(self, output_tag: OutputTag, value: Any) -> None:  # noqa: ANN401
            """Emits ``value`` to the side output ``output_tag`` (declared in ``process``)."""

    class Context(BaseContext):
        @abstractmethod
        def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> BroadcastState:
            """The broadcast state ``state_descriptor`` names, read and written."""

    class ReadOnlyContext(BaseContext):
        @abstractmethod
        def get_broadcast_state(
            self, state_descriptor: MapStateDescriptor
        ) -> ReadOnlyBroadcastState:
            """The broadcast state ``state_descriptor`` names, read only."""


class BroadcastProcessFunction(BaseBroadcastProcessFunction, Generic[IN, T, OUT]):
    """Processes a stream that is not keyed, connected to a broadcast stream
    (``keyedstate.connect(df, keyedstate.broadcast(rules, descriptor))``): as a
    ``KeyedBroadcastProcessFunction`` without keyed state and timers. Each state partition runs
    ``process_broadcast_element`` on every broadcast element, then ``process_element`` on its
    share of the stream's elements."""

    @abstractmethod
    def process_element(
        self, value: IN, ctx: BaseBroadcastProcessFunction.ReadOnlyContext
    ) -> Iterable[OUT] | None: ...

    @abstractmethod
    def process_broadcast_element(
        self, value: T, ctx: BaseBroadcastProcessFunction.Context
    ) -> Iterable[OUT] | None: ...


class KeyedBroadcastProcessFunction(BaseBroadcastProcessFunction, Generic[IN, T, OUT]):
    """Processes a keyed stream connected to a broadcast stream
    (``keyedstate.key_by(events, "user").connect(keyedstate.broadcast(rules, descriptor))``):
    in every micro-batch each state partition first runs ``process_broadcast_element`` on every
    element of the broadcast stream, in the same order, writing the broadcast state, then
    ``process_element`` on its keys' elements, reading it (and keyed state and timers as a
    ``KeyedProcessFunction``). Both yield outputs (or return an iterable, or None)."""

    class Context(BaseBroadcastProcessFunction.Context):
        @abstractmethod
        def apply_to_keyed_state(
            self,
            state_descriptor: Any,
            function: Callable[[Any, State], None],  # noqa: ANN401
        ) -> None:
            """Calls ``function(key, state)`` for every key of the partition that has the keyed
            state ``state_descriptor`` names; the function may read, update or clear it."""

    class ReadOnlyContext(BaseBroadcastProcessFunction.ReadOnlyContext):
        @abstractmethod
        def timer_service(self) -> TimerService: ...

        @abstractmethod
        def get_current_key(self) -> Any:  # noqa: ANN401 - the key's Python value
            """The current key: a value for one key column, a tuple for several."""

    class OnTimerContext(ReadOnlyContext):
        @abstractmethod
        def time_domain(self) -> TimeDomain: ...

    @abstractmethod
    def process_element(
        self, value: IN, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext
    ) -> Iterable[OUT] | None: ...

    @abstractmethod
    def process_broadcast_element(
        self, value: T, ctx: KeyedBroadcastProcessFunction.Context
    ) -> Iterable[OUT] | None: ...

    def on_timer(
        self, timestamp: int, ctx: KeyedBroadcastProcessFunction.OnTimerContext
    ) -> Iterable[OUT] | None:
        """Called when a timer of the current key fires."""
        return None


# ---------------------------------------------------------------------------------------------
# Operator state (CheckpointedFunction)


class OperatorStateStore(ABC):
    """Per-partition ("per parallel instance") list state, redistributed as Flink does when the
    query restores: at a restart and at another partition count (docs/python-api.md, "Operator
    state")."""

    @abstractmethod
    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """Even-split redistribution: at another partition count the partitions' lists are joined
        and each new partition gets an even share; at a restart each keeps its own."""

    @abstractmethod
    def get_union_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        """Union redistribution: at every restore (a restart, another partition count) every
        partition gets the whole joined list of all partitions."""


class FunctionInitializationContext(ABC):
    @abstractmethod
    def is_restored(self) -> bool:
        """Whether this partition had stored operator state before this micro-batch."""

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

    ``initialize_state`` runs after ``open`` in each task, before the partition's elements are
    processed (``is_restored()`` tells whether the partition had operator state), and
    ``snapshot_state`` after them, before the partition's state is committed with the micro-batch.
    """

    @abstractmethod
    def initialize_state(self, context: FunctionInitializationContext) -> None: ...

    @abstractmethod
    def snapshot_state(self, context: FunctionSnapshotContext) -> None: ...
