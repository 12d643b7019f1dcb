"""Per-key timers on real streaming queries: event time and processing time, across restarts.

Event time: several timers per key (a duplicate registration fires once, a deleted timer never
fires, ``on_timer`` registers a follow-up timer), watermark-driven firing in data and no-data
micro-batches, timers registered before a restart firing after it. Every timer must fire
exactly once, in the first micro-batch whose watermark reached it (batch watermarks come from the
checkpoint's offset log).

Processing time: timers fire in the first micro-batch (no-data batches included) whose
timestamp reached them, after a restart too. Timers live in range-scanned column families
(``$eventTimers``/``$procTimers``): after the run, the stored timers are exactly the ones that
have not fired. Each scenario runs on keyedstate's provider and on Spark's RocksDB provider side
by side.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from keyedstate import (
    KeyedProcessFunction,
    RuntimeContext,
    TimeDomain,
    Types,
    ValueStateDescriptor,
    key_by,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.state_api_support import (
    TimedRun,
    batch_metadata,
    on_keyedstate,
    run_jobs,
    ship_by_value,
    stored_state,
)

ship_by_value(__name__)

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("t", LongType()),  # event time, seconds
        StructField("op", StringType()),  # "reg" or "del"
    ]
)
OUTPUT = "key string, kind string, at long, watermark long"
DELAY_S = 5


class EventTimers(KeyedProcessFunction):
    """``reg``: timers at t+4s and t+9s (the first registered twice); ``del``: deletes the key's
    timer at t+9s. A timer at a whole second registers a follow-up 1 ms later."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        timers = ctx.timer_service()
        assert ctx.timestamp() == value.t * 1000
        self.count.update((self.count.value() or 0) + 1)
        if value.op == "reg":
            timers.register_event_time_timer(value.t * 1000 + 4000)
            timers.register_event_time_timer(value.t * 1000 + 4000)
            timers.register_event_time_timer(value.t * 1000 + 9000)
        else:
            timers.delete_event_time_timer(value.t * 1000 + 9000)
        yield (value.key, "element", value.t * 1000, timers.current_watermark())

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:  # noqa: ANN401
        assert ctx.time_domain() == TimeDomain.EVENT_TIME and ctx.timestamp() == timestamp
        if timestamp % 1000 == 0:
            ctx.timer_service().register_event_time_timer(timestamp + 1)
        kind = f"timer:{self.count.value()}"
        yield (ctx.get_current_key(), kind, timestamp, ctx.timer_service().current_watermark())


EVENT_FILES = [
    [{"key": "a", "t": 100, "op": "reg"}, {"key": "b", "t": 101, "op": "reg"}],
    [{"key": "a", "t": 103, "op": "reg"}, {"key": "c", "t": 104, "op": "reg"}],
    [{"key": "b", "t": 112, "op": "reg"}, {"key": "a", "t": 100, "op": "del"}],
    # after the restart
    [{"key": "c", "t": 113, "op": "reg"}, {"key": "d", "t": 121, "op": "reg"}],
    [{"key": "b", "t": 130, "op": "del"}],
]


def expected_timers(files: list[list[dict[str, Any]]], final_watermark: int) -> set[tuple]:
    registered: set[tuple[str, int]] = set()
    for rows in files:
        for row in rows:
            if row["op"] == "reg":
                registered |= {
                    (row["key"], row["t"] * 1000 + 4000),
                    (row["key"], row["t"] * 1000 + 9000),
                }
            else:
                registered.discard((row["key"], row["t"] * 1000 + 9000))
    fired = {(k, t) for k, t in registered if t <= final_watermark}
    follow_ups = {(k, t + 1) for k, t in fired if t % 1000 == 0 and t + 1 <= final_watermark}
    return fired | follow_ups


def test_event_time_timers_fire_once_at_the_first_watermark_past_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    def build(frames: Any) -> Any:  # noqa: ANN401
        events = frames["events"].withColumn("ts", F.timestamp_seconds("t"))
        events = events.withWatermark("ts", f"{DELAY_S} seconds")
        return key_by(events, "key").process(EventTimers(), OUTPUT)

    results = run_jobs(
        spark,
        tmp_path,
        {"events": SCHEMA},
        [{"events": EVENT_FILES[:3]}, {"events": EVENT_FILES[3:]}],
        on_keyedstate(build),
    )
    for label, result in results.items():
        meta = batch_metadata(result.checkpoint)
        watermark_of = {batch: wm for batch, (wm, _) in meta.items()}
        final_watermark = max(watermark_of.values())
        assert final_watermark == (130 - DELAY_S) * 1000, (label, meta)
        fired: dict[tuple[str, int], int] = {}
        for batch, rows in result.batches.items():
            for row in rows:
                assert row["watermark"] == watermark_of[batch], (label, batch, row)
                if row["kind"].startswith("timer"):
                    timer = (row["key"], row["at"])
                    assert timer not in fired, f"{label}: {timer} fired twice"
                    fired[timer] = batch
        assert set(fired) == expected_timers(EVENT_FILES, final_watermark), label
        for (key, at), batch in fired.items():
            first = min(b for b, wm in watermark_of.items() if wm >= at)
            assert batch == first, f"{label}: {key}@{at} fired in batch {batch}, not {first}"
        # Keyed state is readable in on_timer: 'a' had 3 elements when its last timers fired.
        last_a = max(b for (k, _), b in fired.items() if k == "a")
        assert any(r["kind"] == "timer:3" for r in result.batches[last_a] if r["key"] == "a"), label
        # No-data batches fired timers, and timers from before the restart fired after it.
        data_batches = {
            b for b, rows in result.batches.items() if any(r["kind"] == "element" for r in rows)
        }
        assert set(fired.values()) - data_batches, label
        first_batch_after_restart = len(result.progresses[0])
        assert any(
            b >= first_batch_after_restart and at < 113_000 for (_, at), b in fired.items()
        ), label


class ProcessingTimers(KeyedProcessFunction):
    """Per element: timers at +2.5 s, +5 s (deleted again for key 'b') and one already due."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        timers = ctx.timer_service()
        now = timers.current_processing_time()
        self.seen.update(value.t)
        if value.op == "reg":
            timers.register_processing_time_timer(now + 2500)
            timers.register_processing_time_timer(now + 5000)
            timers.register_processing_time_timer(now - 1)
            if value.key == "b":
                timers.delete_processing_time_timer(now + 5000)
        yield (value.key, "element", now, now)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:  # noqa: ANN401
        assert ctx.time_domain() == TimeDomain.PROCESSING_TIME
        now = ctx.timer_service().current_processing_time()
        yield (ctx.get_current_key(), "timer", timestamp, now)


def test_processing_time_timers_fire_once_and_leave_the_store(
    spark: SparkSession, tmp_path: Path
) -> None:
    lonely = "w"
    run = TimedRun(
        spark,
        tmp_path,
        SCHEMA,
        on_keyedstate(
            lambda frames: key_by(frames["events"], "key").process(
                ProcessingTimers(), OUTPUT, timer_mode="processing"
            )
        ),
        trigger="500 milliseconds",
    )
    run.start()
    run.feed(0, [{"key": "a", "t": 1, "op": "reg"}, {"key": "b", "t": 2, "op": "reg"},
                 {"key": lonely, "t": 3, "op": "write"}])  # fmt: skip
    run.wait_idle()
    # The timers were registered before the restart. A restarted Spark query runs no micro-batch
    # before new input arrives (no-data batches resume after the first data batch), so one row
    # for an unrelated key follows the restart.
    run.restart()
    run.feed(0, [{"key": "z", "t": 4, "op": "write"}])

    def all_timers_fired() -> bool:
        return all(
            sum(r["kind"] == "timer" for rows in result.batches.values() for r in rows) >= 5
            for result in run.results.values()
        )

    # Five timers are due (the last one 5 s after the elements), and no others exist.
    run.wait_for(all_timers_fired)
    time.sleep(1)
    run.stop()

    for label, result in run.results.items():
        meta = batch_metadata(result.checkpoint)
        now_of = {batch: ts for batch, (_, ts) in meta.items()}
        rows = [(b, r) for b, rs in result.batches.items() for r in rs]
        elements = {r["key"]: r["at"] for _, r in rows if r["kind"] == "element"}
        assert set(elements) == {"a", "b", lonely, "z"}, (label, rows)
        fired = {(r["key"], r["at"]): (b, r["watermark"]) for b, r in rows if r["kind"] == "timer"}
        assert len(fired) == len([r for _, r in rows if r["kind"] == "timer"]), label
        want = {("a", elements["a"] + d) for d in (-1, 2500, 5000)}
        want |= {("b", elements["b"] + d) for d in (-1, 2500)}
        assert set(fired) == want, (label, sorted(fired), sorted(want))
        for (key, at), (batch, now) in fired.items():
            assert now == now_of[batch] and now >= at, (label, key, at, batch, now)
            first = min(b for b, ts in now_of.items() if ts >= at)
            assert batch == first, f"{label}: {key}@{at} fired in batch {batch}, not {first}"
        # The already-due timers fired in the elements' own batch.
        assert fired[("a", elements["a"] - 1)][0] == min(result.batches), label
        # Fired timers are deleted; the state of every key is stored, typed.
        assert stored_state(spark, result.checkpoint, "$procTimers") == [], label
        seen = stored_state(spark, result.checkpoint, "seen")
        assert seen == sorted(
            ({"key": k, "value": t} for k, t in [("a", 1), ("b", 2), (lonely, 3), ("z", 4)]),
            key=repr,
        ), (label, seen)
