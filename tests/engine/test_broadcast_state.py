"""Broadcast state (issue 35), with the seeds' pattern: rules broadcast to a keyed stream of
events, each event matched against the rules. Every micro-batch's rule changes reach every state
partition before its events; every partition's broadcast state is the same map; the state
survives a restart and a rescale (every new partition gets the map); the output equals a plain
Python model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keyedstate
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.support.keyed_functions import (
    CHANGES,
    RULES,
    CountSum,
    KeyedWriteInBroadcast,
    RuleMatches,
    RuleMatchesFailingOnce,
    RuleMatchesWithReset,
    RuleTags,
    RuleTimers,
)
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    start_query,
)

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
EVENTS = T.StructType(
    [T.StructField("user", T.StringType()), T.StructField("amount", T.LongType())]
)
RULE_CHANGES = T.StructType(
    [T.StructField("rule", T.StringType()), T.StructField("threshold", T.LongType())]
)
OUTPUT = "user string, amount long, rule string, n long"

Rows = list[dict[str, Any]]


class Model:
    """The function in plain Python: per micro-batch the rule changes, in order, then the events."""

    def __init__(self) -> None:
        self.rules: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def batch(self, changes: Rows, events: Rows) -> list[tuple[str, int, str, int]]:
        for change in changes:
            if change["rule"] == "reset":  # RuleMatchesWithReset only
                self.counts = dict.fromkeys(self.counts, change["threshold"])
            elif change["threshold"] is None:
                self.rules.pop(change["rule"], None)
            else:
                self.rules[change["rule"]] = change["threshold"]
        out = []
        for event in events:
            n = self.counts[event["user"]] = self.counts.get(event["user"], 0) + 1
            out += [
                (event["user"], event["amount"], rule, n)
                for rule, threshold in sorted(self.rules.items())
                if event["amount"] >= threshold
            ]
        return sorted(out)


class Line:
    def __init__(self, spark: SparkSession, root: Path, function: Any = RuleMatches) -> None:  # noqa: ANN401
        self.spark = spark
        self.function = function
        self.events = FileInput(root / "events", EVENTS)
        self.rules = FileInput(root / "rules", RULE_CHANGES)
        self.model = Model()

    def run(self, checkpoint: Path, changes: Rows, events: Rows, partitions: int = 2) -> None:
        """One micro-batch of both streams; its output must be the model's."""
        if changes:
            self.rules.add(changes)
        if events:
            self.events.add(events)
        previous = self.spark.conf.get(SHUFFLE_PARTITIONS)
        self.spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))
        try:
            rules = keyedstate.broadcast(self.rules.read_stream(self.spark), RULES)
            frame = (
                keyedstate.key_by(self.events.read_stream(self.spark), "user")
                .connect(rules)
                .process(self.function(), OUTPUT, uid="matches")
            )
            collector = BatchCollector()
            await_finished(
                start_query(self.spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
            )
        finally:
            self.spark.conf.set(SHUFFLE_PARTITIONS, previous)
        got = sorted(tuple(r.values()) for rows in collector.batches.values() for r in rows)
        assert got == self.model.batch(changes, events)

    def assert_every_partition_holds_the_rules(self, checkpoint: Path, partitions: int) -> None:
        rows = keyedstate.state.read(self.spark, str(checkpoint), "matches", "rules").collect()
        maps: dict[int, dict[str, int]] = {p: {} for p in range(partitions)}
        for r in rows:
            maps[r["partition_id"]][r["user_map_key"]] = r["value"]
        assert maps == {p: self.model.rules for p in range(partitions)}


def events(users: int, amounts: list[int]) -> Rows:
    return [{"user": f"u{u}", "amount": a} for u in range(users) for a in amounts]


def test_rules_reach_every_partition_before_its_events_across_a_restart_and_a_rescale(
    spark: SparkSession, tmp_path: Path
) -> None:
    line = Line(spark, tmp_path)
    checkpoint = tmp_path / "checkpoint"
    # Rules and events in one micro-batch: the events already see the rules.
    line.run(
        checkpoint,
        [{"rule": "r10", "threshold": 10}, {"rule": "r50", "threshold": 50}],
        events(6, [5, 20, 60]),
    )
    line.assert_every_partition_holds_the_rules(checkpoint, 2)
    # A restart: the rules were checkpointed; a change and a removal in the order given.
    line.run(
        checkpoint,
        [
            {"rule": "r30", "threshold": 30},
            {"rule": "r50", "threshold": None},
            {"rule": "r30", "threshold": 25},
        ],
        events(6, [26, 70]),
    )
    line.assert_every_partition_holds_the_rules(checkpoint, 2)
    # Only rules, no events: every partition still takes them.
    line.run(checkpoint, [{"rule": "r99", "threshold": 99}], [])
    line.assert_every_partition_holds_the_rules(checkpoint, 2)
    # A rescale: every new partition gets the map.
    three = tmp_path / "three"
    keyedstate.rescale(spark, str(checkpoint), 3, str(three))
    line.assert_every_partition_holds_the_rules(three, 3)
    line.run(three, [], events(9, [12, 100]), partitions=3)
    line.assert_every_partition_holds_the_rules(three, 3)
    # A canonical savepoint restored at fewer partitions, a native one at more.
    savepoint = tmp_path / "savepoint"
    keyedstate.savepoint(spark, str(three), str(savepoint), format="canonical")
    two = tmp_path / "two"
    keyedstate.restore_savepoint(spark, str(savepoint), str(two), partitions=2)
    line.assert_every_partition_holds_the_rules(two, 2)
    line.run(two, [{"rule": "r10", "threshold": None}], events(9, [15, 40]), partitions=2)
    line.assert_every_partition_holds_the_rules(two, 2)
    native = tmp_path / "native"
    keyedstate.savepoint(spark, str(two), str(native))
    five = tmp_path / "five"
    keyedstate.restore_savepoint(spark, str(native), str(five), partitions=5)
    line.assert_every_partition_holds_the_rules(five, 5)
    line.run(five, [{"rule": "r7", "threshold": 7}], events(9, [8]), partitions=5)
    line.assert_every_partition_holds_the_rules(five, 5)


def test_apply_to_keyed_state_visits_every_stored_key_before_the_batch_s_elements(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A ``reset`` rule sets every user's count through ``apply_to_keyed_state``: users with
    events in that batch continue from it, users without are reset all the same."""
    line = Line(spark, tmp_path, RuleMatchesWithReset)
    checkpoint = tmp_path / "checkpoint"
    line.run(checkpoint, [{"rule": "r10", "threshold": 10}], events(6, [5, 20]))
    line.run(checkpoint, [{"rule": "reset", "threshold": 100}], events(3, [30]))
    line.run(checkpoint, [], events(6, [40]))
    counts = keyedstate.state.read(spark, str(checkpoint), "matches", "count").collect()
    assert {r["user"]: r["value"] for r in counts} == line.model.counts


def test_a_failed_batch_is_replayed_and_its_broadcast_elements_applied_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch that fails after its broadcast elements ran in Python commits nothing: the run
    after the failure replays it, each change is applied once (a count of applied changes in a
    second broadcast state shows it), and the output is the model's, exactly once."""
    events_in = FileInput(tmp_path / "events", EVENTS)
    rules_in = FileInput(tmp_path / "rules", RULE_CHANGES)
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "failed-once"
    model = Model()
    changes = [{"rule": "r10", "threshold": 10}, {"rule": "r5", "threshold": 5}]
    batch = events(4, [13, 40])
    rules_in.add(changes)
    events_in.add(batch)

    def frame() -> Any:  # noqa: ANN401
        rules = keyedstate.broadcast(rules_in.read_stream(spark), RULES, CHANGES)
        return (
            keyedstate.key_by(events_in.read_stream(spark), "user")
            .connect(rules)
            .process(RuleMatchesFailingOnce(str(marker)), OUTPUT, uid="matches")
        )

    failed = BatchCollector()
    query = start_query(spark, PROVIDER_UNDER_TEST, frame(), "append", checkpoint, failed)
    with pytest.raises(Exception, match="injected failure"):  # noqa: B017 - Spark's wrapper
        await_finished(query)
    assert marker.exists() and not failed.batches
    collector = BatchCollector()
    query = start_query(spark, PROVIDER_UNDER_TEST, frame(), "append", checkpoint, collector)
    await_finished(query)
    got = sorted(tuple(r.values()) for rows in collector.batches.values() for r in rows)
    assert got == model.batch(changes, batch)
    counts = keyedstate.state.read(spark, str(checkpoint), "matches", "changes").collect()
    assert sorted((r["partition_id"], r["value"]) for r in counts) == [(0, 2), (1, 2)]


def test_both_streams_hold_the_watermark_and_timers_read_the_rules(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Each input has its own watermark; the function's is the smaller (Spark's rule for several
    inputs): the broadcast stream holds back a timer the events' watermark alone would fire.
    ``on_timer`` reads the broadcast state."""
    events_in = FileInput(tmp_path / "events", EVENTS)
    rules_in = FileInput(tmp_path / "rules", RULE_CHANGES)
    checkpoint = tmp_path / "checkpoint"

    def run(rules: Rows, batch: Rows) -> list[tuple[Any, ...]]:
        rules_in.add(rules)
        events_in.add(batch)
        events_df = events_in.read_stream(spark).withColumn("ts", F.timestamp_seconds("amount"))
        rules_df = rules_in.read_stream(spark).withColumn("ts", F.timestamp_seconds("threshold"))
        frame = (
            keyedstate.key_by(events_df.withWatermark("ts", "0 seconds"), "user")
            .connect(keyedstate.broadcast(rules_df.withWatermark("ts", "0 seconds"), RULES))
            .process(RuleTimers(), "user string, timer long, rules array<string>")
        )
        collector = BatchCollector()
        query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
        await_finished(query)
        return sorted(tuple(r.values()) for rows in collector.batches.values() for r in rows)

    # Events at 100 s (a timer at 110 s), a rule at 0 s: the watermark stays at 0, nothing fires.
    assert run([{"rule": "r0", "threshold": 0}], [{"user": "a", "amount": 100}]) == []
    # An event at 300 s, a rule at 105 s: the events' watermark alone would fire a's timer; the
    # rules hold the function's at 105 s.
    assert run([{"rule": "r105", "threshold": 105}], [{"user": "b", "amount": 300}]) == []
    # A rule at 200 s (and an event at 300 s: after a restart Spark counts an input without data
    # as watermark 0): the watermark reaches 200 s, a's timer fires and sees the three rules;
    # b's and c's (310 s) wait.
    fired = run([{"rule": "r200", "threshold": 200}], [{"user": "c", "amount": 300}])
    assert fired == [("a", 110_000, ["r0", "r105", "r200"])]
    # ctx.timestamp() in process_broadcast_element is the broadcast element's event time.
    stored = keyedstate.state.read(spark, str(checkpoint), state=RULES.name).collect()
    assert {(r.user_map_key, r.value) for r in stored} == {
        ("r0", 0),
        ("r105", 105_000),
        ("r200", 200_000),
    }


def test_a_stream_that_is_not_keyed_takes_the_rules_in_every_partition(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A ``BroadcastProcessFunction`` through ``keyedstate.connect``: its elements spread over
    the partitions, each holding the rules; across a restart."""
    events_in = FileInput(tmp_path / "events", EVENTS)
    rules_in = FileInput(tmp_path / "rules", RULE_CHANGES)
    checkpoint = tmp_path / "checkpoint"
    model = Model()
    for changes, batch in (
        ([{"rule": "r10", "threshold": 10}, {"rule": "r50", "threshold": 50}], events(5, [5, 60])),
        ([{"rule": "r10", "threshold": None}, {"rule": "r20", "threshold": 20}], events(5, [30])),
    ):
        rules_in.add(changes)
        events_in.add(batch)
        frame = keyedstate.connect(
            events_in.read_stream(spark), keyedstate.broadcast(rules_in.read_stream(spark), RULES)
        ).process(RuleTags(), "user string, amount long, rule string", uid="tags")
        collector = BatchCollector()
        query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
        await_finished(query)
        got = sorted(tuple(r.values()) for rows in collector.batches.values() for r in rows)
        assert got == sorted((u, a, rule) for u, a, rule, _ in model.batch(changes, batch))
        rows = keyedstate.state.read(spark, str(checkpoint), "tags", "rules").collect()
        maps: dict[int, dict[str, int]] = {p: {} for p in range(2)}
        for r in rows:
            maps[r["partition_id"]][r["user_map_key"]] = r["value"]
        assert maps == {p: model.rules for p in range(2)}


def test_keyed_state_without_a_current_key_is_refused_in_process_broadcast_element(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Flink refuses keyed state in processBroadcastElement (no current key): so does
    keyedstate, naming apply_to_keyed_state, rather than losing the write."""
    events_in = FileInput(tmp_path / "events", EVENTS)
    rules_in = FileInput(tmp_path / "rules", RULE_CHANGES)
    rules_in.add([{"rule": "r1", "threshold": 1}])
    events_in.add(events(2, [5]))
    frame = (
        keyedstate.key_by(events_in.read_stream(spark), "user")
        .connect(keyedstate.broadcast(rules_in.read_stream(spark), RULES))
        .process(KeyedWriteInBroadcast(), OUTPUT)
    )
    checkpoint = tmp_path / "checkpoint"
    query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, BatchCollector())
    with pytest.raises(Exception, match="keyed state has no current key"):  # noqa: B017
        await_finished(query)


def test_broadcast_misuse_is_refused_with_the_reason(spark: SparkSession, tmp_path: Path) -> None:
    events_in = FileInput(tmp_path / "events", EVENTS)
    rules_in = FileInput(tmp_path / "rules", RULE_CHANGES)
    keyed = keyedstate.key_by(events_in.read_stream(spark), "user")
    with pytest.raises(keyedstate.StateUsageError, match="broadcast state is a map"):
        not_a_map = keyedstate.ValueStateDescriptor("x", keyedstate.Types.LONG())
        keyedstate.broadcast(rules_in.read_stream(spark), not_a_map)  # type: ignore[arg-type]
    rules = keyedstate.broadcast(rules_in.read_stream(spark), RULES)
    with pytest.raises(keyedstate.StateUsageError, match="runs a KeyedBroadcastProcessFunction"):
        keyed.connect(rules).process(CountSum(), OUTPUT)  # type: ignore[arg-type]
    with pytest.raises(keyedstate.StateUsageError, match="runs a BroadcastProcessFunction"):
        keyedstate.connect(events_in.read_stream(spark), rules).process(RuleMatches(), OUTPUT)  # type: ignore[arg-type]
    with pytest.raises(keyedstate.StateUsageError, match="a BroadcastProcessFunction has no keyed"):
        keyedstate.connect(events_in.read_stream(spark), rules).process(KeyedTags(), OUTPUT)


class KeyedTags(RuleTags):
    """``RuleTags`` creating keyed state, which a stream that is not keyed has none of."""

    def open(self, runtime_context: Any) -> None:  # noqa: ANN401
        runtime_context.get_state(keyedstate.ValueStateDescriptor("n", keyedstate.Types.LONG()))

