"""Keyed functions that tests and drivers share. The Python workers cannot import test modules:
this one's classes travel to them by value."""

from __future__ import annotations

from typing import Any

from keyedstate import (
    BroadcastProcessFunction,
    CheckpointedFunction,
    FlatMapFunction,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    RuntimeContext,
    StateTtlConfig,
    Time,
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


def last_per_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch of ``CountSum``'s rows as an aggregation in update mode emits it: each key's last
    row (its largest count), sorted by key."""
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["key"] not in last or row["cnt"] > last[row["key"]]["cnt"]:
            last[row["key"]] = row
    return sorted(last.values(), key=lambda r: r["key"])


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


# Rules broadcast to a keyed stream of events (the seeds' broadcast state pattern): rule name ->
# the amount an event must reach to match it.
RULES = MapStateDescriptor("rules", Types.STRING(), Types.LONG())
COUNT = ValueStateDescriptor("count", Types.LONG())


def apply_rule_change(value: Any, ctx: Any) -> None:  # noqa: ANN401
    """A rule element: puts the rule, or (a null threshold) removes it."""
    rules = ctx.get_broadcast_state(RULES)
    if value.threshold is None:
        rules.remove(value.rule)
    else:
        rules.put(value.rule, value.threshold)


class RuleMatches(KeyedBroadcastProcessFunction):
    """Rules ``(rule, threshold)`` broadcast to events ``(user, amount)`` keyed by user: a rule
    element puts the rule (a null threshold removes it); each event emits
    ``(user, amount, rule, n)`` for every rule it reaches, ``n`` the user's event count (keyed
    state)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(COUNT)

    def process_broadcast_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        apply_rule_change(value, ctx)

    def process_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        for rule, threshold in sorted(ctx.get_broadcast_state(RULES).items()):
            if value.amount >= threshold:
                yield value.user, value.amount, rule, n


class RuleMatchesWithReset(RuleMatches):
    """``RuleMatches`` where a rule named ``reset`` is not kept: it sets every user's event count
    to its threshold, through ``apply_to_keyed_state`` (Flink's ``applyToKeyedState``)."""

    def process_broadcast_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        if value.rule != "reset":
            return super().process_broadcast_element(value, ctx)
        ctx.apply_to_keyed_state(COUNT, lambda user, count: count.update(value.threshold))
        return None


class RuleTags(BroadcastProcessFunction):
    """``RuleMatches`` on a stream that is not keyed: each event ``(user, amount)`` emits
    ``(user, amount, rule)`` for every rule it reaches; no keyed state."""

    def process_broadcast_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        apply_rule_change(value, ctx)

    def process_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        for rule, threshold in sorted(ctx.get_broadcast_state(RULES).items()):
            if value.amount >= threshold:
                yield value.user, value.amount, rule


CHANGES = MapStateDescriptor("changes", Types.STRING(), Types.LONG())


class RuleMatchesFailingOnce(RuleMatches):
    """``RuleMatches`` that also counts the rule changes it applied (broadcast state ``changes``,
    not idempotent: a replayed change applied twice would show), and fails the first time it
    sees an event of amount 13, when ``marker`` does not exist yet (it creates it)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def process_broadcast_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        changes = ctx.get_broadcast_state(CHANGES)
        changes.put("count", (changes.get("count") or 0) + 1)
        return super().process_broadcast_element(value, ctx)

    def process_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        import os

        if value.amount == 13 and not os.path.exists(self.marker):
            open(self.marker, "w").close()  # noqa: SIM115
            raise RuntimeError("injected failure: the batch fails once")
        yield from super().process_element(value, ctx)


class RuleTimers(KeyedBroadcastProcessFunction):
    """Rules put by the broadcast stream, each with its element's event time; each event
    registers an event-time timer 10 s after it, which emits ``(user, timer, rules)``: the rules
    ``on_timer`` reads when it fires."""

    def process_broadcast_element(self, value: Any, ctx: Any) -> None:  # noqa: ANN401
        ctx.get_broadcast_state(RULES).put(value.rule, ctx.timestamp())

    def process_element(self, value: Any, ctx: Any) -> None:  # noqa: ANN401
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 10_000)

    def on_timer(self, timestamp: int, ctx: Any):  # noqa: ANN401, ANN201
        yield ctx.get_current_key(), timestamp, sorted(ctx.get_broadcast_state(RULES).keys())


class KeyedWriteInBroadcast(RuleMatches):
    """``RuleMatches`` writing keyed state in ``process_broadcast_element``, where no key is."""

    def process_broadcast_element(self, value: Any, ctx: Any) -> None:  # noqa: ANN401
        self.count.update(0)


class QueryableTotals(KeyedProcessFunction):
    """Per key: the running total of ``v`` (value state, queryable as ``totals``), every ``v``
    seen (list state, ``amounts``), the count per ``tag`` (map state, ``tags``), and a pickled
    object (``last``); emits ``(key, total)`` per element. ``fail_on`` makes an element with that
    ``v`` raise (a failing batch); an element tagged ``pause`` writes ``<pause_file>.reached`` and
    waits (up to 120 s) until ``pause_file`` exists."""

    def __init__(self, fail_on: int | None = None, pause_file: str | None = None) -> None:
        self.fail_on = fail_on
        self.pause_file = pause_file

    def open(self, runtime_context: RuntimeContext) -> None:
        total = ValueStateDescriptor("total", Types.LONG())
        total.set_queryable("totals")
        amounts = ListStateDescriptor("amounts", Types.LONG())
        amounts.set_queryable("amounts")
        tags = MapStateDescriptor("tags", Types.STRING(), Types.INT())
        tags.set_queryable("tags")
        last = ValueStateDescriptor("last")
        last.set_queryable("last")
        self.total = runtime_context.get_state(total)
        self.amounts = runtime_context.get_list_state(amounts)
        self.tags = runtime_context.get_map_state(tags)
        self.last = runtime_context.get_state(last)

    def process_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        if self.fail_on is not None and value.v == self.fail_on:
            raise RuntimeError(f"failing on v={value.v}")
        if self.pause_file is not None and value.tag == "pause":
            import os
            import time

            open(self.pause_file + ".reached", "w").close()  # noqa: SIM115
            deadline = time.monotonic() + 120
            while not os.path.exists(self.pause_file) and time.monotonic() < deadline:
                time.sleep(0.05)
        total = (self.total.value() or 0) + value.v
        self.total.update(total)
        self.amounts.add(value.v)
        self.tags.put(value.tag, (self.tags.get(value.tag) or 0) + 1)
        self.last.update({"v": value.v, "tag": value.tag})
        yield ctx.get_current_key(), total


class QueryableDaily(KeyedProcessFunction):
    """Keyed by ``(k, day, amount_class)``: the last ``Row(at, price)`` per key, queryable as
    ``daily`` (a key of several typed columns, a struct value with a timestamp and a decimal)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        last = ValueStateDescriptor(
            "last", Types.ROW_NAMED(["at", "price"], [Types.SQL_TIMESTAMP(), Types.BIG_DEC()])
        )
        last.set_queryable("daily")
        self.last = runtime_context.get_state(last)

    def process_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        self.last.update((value.at, value.price))
        yield value.k, value.price


class QueryableRecent(KeyedProcessFunction):
    """Every ``v`` of the last ``ttl_s`` seconds of processing time per key (a list state with a
    TTL, queryable as ``recent``): lookups hide expired elements as the function does."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s

    def open(self, runtime_context: RuntimeContext) -> None:
        recent = ListStateDescriptor("recent", Types.LONG())
        recent.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(self.ttl_s)).build())
        recent.set_queryable("recent")
        self.recent = runtime_context.get_list_state(recent)

    def process_element(self, value: Any, ctx: Any):  # noqa: ANN401, ANN201
        self.recent.add(value.v)
        yield ctx.get_current_key(), value.v
