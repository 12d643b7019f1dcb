"""Keyed functions that tests and drivers share. The Python workers cannot import test modules:
this one's classes travel to them by value."""

from __future__ import annotations

from typing import Any

from keyedstate import (
    CheckpointedFunction,
    FlatMapFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
)

from tests.support.state_api_support import ship_by_value

ship_by_value(__name__)


class CountSum(KeyedProcessFunction):
    """A running count and sum of ``v`` per key in a ValueState, emitted per element as
    ``output(value, cnt, total)``: ``(key, cnt, total)``."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.totals = runtime_context.get_state(
            ValueStateDescriptor("totals", Types.TUPLE([Types.LONG(), Types.LONG()]))
        )

    def process_element(self, value, ctx):  # noqa: ANN001, ANN201
        cnt, total = self.totals.value() or (0, 0)
        cnt, total = cnt + 1, total + value.v
        self.totals.update((cnt, total))
        yield self.output(value, cnt, total)

    def output(self, value: Any, cnt: int, total: int) -> tuple[Any, ...]:  # noqa: ANN401
        return value.key, cnt, total


class CountsProcessed(CheckpointedFunction):
    """Operator state: how many elements the partition processed, ``processed`` (a function
    adds 1 per element), kept in the operator list state ``processed`` and restored as the sum
    of its entries."""

    processed = 0

    def initialize_state(self, context: Any) -> None:  # noqa: ANN401
        self.processed_state = context.get_operator_state_store().get_list_state(
            ListStateDescriptor("processed", Types.LONG())
        )
        if context.is_restored():
            self.processed = sum(self.processed_state.get())

    def snapshot_state(self, context: Any) -> None:  # noqa: ANN401
        self.processed_state.clear()
        self.processed_state.add(self.processed)


class RestoredOperatorLists(FlatMapFunction, CheckpointedFunction):
    """The seeds' CheckpointCount with both of Flink's redistributions: ``counts`` (even split,
    ``get_list_state``) holds the partition's element count, ``members`` (union,
    ``get_union_list_state``) one ``"<partition>:<count>"`` entry per partition. The first element
    of a micro-batch reports what the partition restored: ``(partition, counts, members)``."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.partition = runtime_context.get_index_of_this_subtask()

    def initialize_state(self, context: Any) -> None:  # noqa: ANN401
        store = context.get_operator_state_store()
        self.counts = store.get_list_state(ListStateDescriptor("counts", Types.LONG()))
        self.members = store.get_union_list_state(ListStateDescriptor("members", Types.STRING()))
        restored = context.is_restored()
        self.restored_counts = list(self.counts.get()) if restored else []
        self.restored_members = list(self.members.get()) if restored else []
        self.count = sum(self.restored_counts)
        self.reported = False

    def flat_map(self, value: Any):  # noqa: ANN001, ANN201, ANN401
        self.count += 1
        if not self.reported:
            self.reported = True
            yield self.partition, self.restored_counts, self.restored_members

    def snapshot_state(self, context: Any) -> None:  # noqa: ANN401
        self.counts.update([self.count])
        self.members.update([f"{self.partition}:{self.count}"])
