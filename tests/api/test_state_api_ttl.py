"""State TTL on real streaming queries: update types, visibility, per-element TTL.

TTL is keyedstate's provider's (docs/ttl.md): each state variable is a column family with its
own TTL and cleanup strategy. It runs on processing time, which is each micro-batch's timestamp.
The query runs on a processing-time trigger and gets one input file per micro-batch at planned
moments (so some values are read before their TTL and some after), with a restart in the middle.
Every output row carries its batch's processing time, and the expected outputs are computed in
plain Python from those times, so the check is exact whatever the machine's speed. Then the
stored state is read back from the checkpoint (``keyedstate.state.read``, as the query sees it
at its last batch). On Spark's RocksDB provider, which has no per-column-family TTL, a TTL'd
state is refused before the query starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from keyedstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    RuntimeContext,
    StateTtlConfig,
    Time,
    Types,
    ValueStateDescriptor,
    key_by,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.state_api_support import TimedRun, ship_by_value, stored_state
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    sort_rows,
    start_query,
)

ship_by_value(__name__)

TTL_MS = 10_000
SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("op", StringType()),
        StructField("n", LongType()),
    ]
)
OUTPUT = "key string, op string, now long, view string"


def ttl(update: StateTtlConfig.UpdateType) -> StateTtlConfig.Builder:
    return StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).set_update_type(update)


CREATE_WRITE = StateTtlConfig.UpdateType.OnCreateAndWrite
READ_WRITE = StateTtlConfig.UpdateType.OnReadAndWrite


class TtlProbe(KeyedProcessFunction):
    """``write n`` writes every state; ``read`` reads every state and emits what it got."""

    def open(self, runtime_context: RuntimeContext) -> None:
        cw = ValueStateDescriptor("cw", Types.LONG())
        cw.enable_time_to_live(ttl(CREATE_WRITE).build())
        rw = ValueStateDescriptor("rw", Types.LONG())
        rw.enable_time_to_live(ttl(READ_WRITE).build())
        ret = ValueStateDescriptor("ret", Types.LONG())
        ret.enable_time_to_live(
            ttl(CREATE_WRITE)
            .set_state_visibility(StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp)
            .disable_cleanup_in_background()
            .build()
        )
        lst = ListStateDescriptor("lst", Types.LONG())
        lst.enable_time_to_live(ttl(CREATE_WRITE).cleanup_full_snapshot().build())
        mp = MapStateDescriptor("mp", Types.STRING(), Types.LONG())
        mp.enable_time_to_live(ttl(READ_WRITE).cleanup_incrementally(10, False).build())
        self.cw = runtime_context.get_state(cw)
        self.rw = runtime_context.get_state(rw)
        self.ret = runtime_context.get_state(ret)
        self.lst = runtime_context.get_list_state(lst)
        self.mp = runtime_context.get_map_state(mp)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        now = ctx.timer_service().current_processing_time()
        if value.op == "write":
            for state in (self.cw, self.rw, self.ret):
                state.update(value.n)
            self.lst.add(value.n)
            self.mp.put(f"e{value.n}", value.n)
            yield (value.key, value.op, now, "null")
        else:
            view = {
                "cw": self.cw.value(),
                "rw": self.rw.value(),
                "ret": self.ret.value(),
                "lst": self.lst.get(),
                "mp": sorted(self.mp.items()),
            }
            yield (value.key, value.op, now, json.dumps(view, sort_keys=True))


# (planned second after the first batch, rows); the query restarts before the last file.
TIMELINE = [
    (0.0, [("a", "write", 1), ("b", "write", 2), ("c", "write", 3), ("idle", "write", 4)]),
    (4.0, [("a", "read", 0), ("b", "write", 5), ("c", "read", 0)]),
    (12.0, [("a", "read", 0), ("b", "read", 0), ("c", "read", 0)]),
    (26.0, [("b", "read", 0), ("c", "write", 6)]),
]
RESTART_BEFORE = 3


class Model:
    """Flink's TTL semantics on plain values: ``expired`` when last access + TTL <= now."""

    def __init__(self) -> None:
        self.keys: dict[str, dict[str, Any]] = {}

    @staticmethod
    def expired(ts: int, now: int) -> bool:
        return ts + TTL_MS <= now

    def write(self, key: str, n: int, now: int) -> None:
        st = self.keys.setdefault(key, {"lst": [], "mp": {}})
        for name in ("cw", "rw", "ret"):
            st[name] = (n, now)
        st["lst"].append((n, now))
        st["mp"][f"e{n}"] = (n, now)

    def read(self, key: str, now: int) -> dict[str, Any]:
        st = self.keys.setdefault(key, {"lst": [], "mp": {}})
        view: dict[str, Any] = {}
        for name, refresh, return_expired in (
            ("cw", False, False),
            ("rw", True, False),
            ("ret", False, True),
        ):
            entry = st.get(name)
            if entry is None:
                view[name] = None
            elif self.expired(entry[1], now):
                # Hidden, or returned until a cleanup strategy removes it ('ret' has none).
                view[name] = entry[0] if return_expired else None
                if not return_expired:
                    del st[name]
            else:
                view[name] = entry[0]
                if refresh:
                    st[name] = (entry[0], now)
        st["lst"] = [e for e in st["lst"] if not self.expired(e[1], now)]
        view["lst"] = [v for v, _ in st["lst"]]
        st["mp"] = {k: (v, now) for k, (v, ts) in st["mp"].items() if not self.expired(ts, now)}
        view["mp"] = sorted([k, v] for k, (v, _) in st["mp"].items())
        return view

    def live(self, now: int) -> dict[str, list[dict[str, Any]]]:
        """What a reader sees at ``now``: unexpired entries, and 'ret' even when expired, each
        with the time its TTL counts from."""
        out: dict[str, list[dict[str, Any]]] = {n: [] for n in ("cw", "rw", "ret", "lst", "mp")}
        stamp = "last_access_timestamp"
        for key, st in self.keys.items():
            for name in ("cw", "rw", "ret"):
                entry = st.get(name)
                if entry is not None and (name == "ret" or not self.expired(entry[1], now)):
                    out[name].append({"key": key, "value": entry[0], stamp: entry[1]})
            for v, ts in st["lst"]:
                if not self.expired(ts, now):
                    out["lst"].append({"key": key, "value": v, stamp: ts})
            for k, (v, ts) in st["mp"].items():
                if not self.expired(ts, now):
                    out["mp"].append({"key": key, "user_map_key": k, "value": v, stamp: ts})
        return {name: sorted(rows, key=repr) for name, rows in out.items()}


def test_ttl_update_types_and_visibility(spark: SparkSession, tmp_path: Path) -> None:
    run = TimedRun(
        spark,
        tmp_path,
        SCHEMA,
        {
            "keyedstate": (
                PROVIDER_UNDER_TEST,
                lambda frames: key_by(frames["events"], "key").process(TtlProbe(), OUTPUT),
            )
        },
    )
    run.start()
    for index, (at_s, rows) in enumerate(TIMELINE):
        if index == RESTART_BEFORE:
            run.restart()
        run.feed(at_s, [{"key": k, "op": op, "n": n} for k, op, n in rows])
        if index == 0:
            run.wait_idle()
            first = run.results["keyedstate"].collector.batches[0][0]["now"]
            run.anchor(first)
    run.stop()

    coverage: set[str] = set()
    for label, result in run.results.items():
        batches = result.collector.non_empty()
        assert sorted(batches) == list(range(len(TIMELINE))), (label, sorted(batches))
        model = Model()
        for batch, (_, rows) in enumerate(TIMELINE):
            got = batches[batch]
            now = got[0]["now"]
            assert {r["now"] for r in got} == {now}, (label, batch, got)
            want = []
            for key, op, n in rows:
                if op == "write":
                    model.write(key, n, now)
                    want.append({"key": key, "op": op, "now": now, "view": "null"})
                else:
                    view = model.read(key, now)
                    want.append(
                        {"key": key, "op": op, "now": now, "view": json.dumps(view, sort_keys=True)}
                    )
                    coverage |= {f"{name}:{'live' if v else 'gone'}" for name, v in view.items()}
                    if view["rw"] is not None and view["cw"] is None:
                        coverage.add("rw kept alive by reads")
                    if view["ret"] is not None and view["cw"] is None:
                        coverage.add("ret returned expired")
            assert got == sort_rows(want), f"{label} batch {batch}: {got} != {sort_rows(want)}"

        # The stored state at the last batch's time: per state, one row per live value,
        # element or entry with its last access ('idle' was written once, 26 s before: only
        # 'ret' still shows it).
        want_stored = model.live(now)
        for name, rows in want_stored.items():
            assert stored_state(spark, result.checkpoint, name) == rows, (label, name)
        assert [r["key"] for r in want_stored["ret"]].count("idle") == 1

    # The timeline exercised both sides of every rule (timing is planned with seconds of margin).
    assert {
        "cw:live", "cw:gone", "rw:live", "rw:gone", "lst:live", "lst:gone", "mp:live", "mp:gone",
        "rw kept alive by reads", "ret returned expired",
    } <= coverage, coverage  # fmt: skip


class Churn(KeyedProcessFunction):
    """One TTL'd value per key, removed by the provider's incremental cleanup once expired."""

    every_record = False  # cleanup on every state access, reads included, or at commits only

    def open(self, runtime_context: RuntimeContext) -> None:
        seen = ValueStateDescriptor("seen", Types.LONG())
        seen.enable_time_to_live(
            StateTtlConfig.new_builder(Time.milliseconds(500))
            .cleanup_incrementally(1000, self.every_record)
            .build()
        )
        self.seen = runtime_context.get_state(seen)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        self.seen.update(value.n)
        yield (value.key, value.op, 0, "null")


class ChurnEveryRecord(Churn):
    every_record = True


PIPELINED_RUNNER = "spark.python.udf.pipelined.enabled"


@pytest.fixture
def pipelined_runner(spark: SparkSession) -> Iterator[None]:
    """Spark's pipelined Python runner, switched on in the running SparkContext's conf (local
    mode's executor shares it; a user sets it when the session starts), then restored."""
    conf = spark.sparkContext._jsc.sc().conf()  # type: ignore[union-attr]  # SparkEnv's too
    before = conf.get(PIPELINED_RUNNER) if conf.contains(PIPELINED_RUNNER) else None
    conf.set(PIPELINED_RUNNER, "true")
    try:
        yield
    finally:
        if before is None:
            conf.remove(PIPELINED_RUNNER)
        else:
            conf.set(PIPELINED_RUNNER, before)


@pytest.mark.classic_only(
    "switches the SparkContext's pipelined runner on; a Connect client has no SparkContext"
)
def test_cleanup_on_every_record_is_refused_under_the_pipelined_python_runner(
    spark: SparkSession, tmp_path: Path, pipelined_runner: None
) -> None:
    """The pipelined runner reads (the lookup) in another thread than the task's writes, and
    cleanup on every record writes on reads: refused when the query starts, the state named."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"key": "a", "op": "write", "n": 1}])
    frame = key_by(source.read_stream(spark), "key").process(ChurnEveryRecord(), OUTPUT)
    query = start_query(
        spark, PROVIDER_UNDER_TEST, frame, "append", tmp_path / "ckpt", BatchCollector()
    )
    with pytest.raises(
        (StreamingQueryException, AssertionError), match="KEYED_FUNCTION_PIPELINED_RUNNER"
    ) as failure:
        await_finished(query)
    assert "state 'seen' of keyed function ChurnEveryRecord" in str(failure.value)


@pytest.mark.classic_only(
    "switches the SparkContext's pipelined runner on; a Connect client has no SparkContext"
)
def test_ttl_state_that_reads_without_writing_runs_under_the_pipelined_python_runner(
    spark: SparkSession, tmp_path: Path, pipelined_runner: None
) -> None:
    """Incremental cleanup at commits only: the lookup's reads write nothing, the query runs
    and counts its keys exactly (the key count's memo is shared by both threads). The same
    query is refused with cleanup on every record (the test above)."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"key": f"k{i}", "op": "write", "n": i} for i in range(300)])
    frame = key_by(source.read_stream(spark), "key").process(Churn(), OUTPUT)
    collector = BatchCollector()
    query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", tmp_path / "ckpt", collector)
    await_finished(query)
    assert sorted(r["key"] for rows in collector.batches.values() for r in rows) == sorted(
        f"k{i}" for i in range(300)
    )
    operator = next(p for p in query.recentProgress if p.numInputRows).stateOperators[0]
    assert operator.numRowsTotal == 300, operator


class PlainCount(KeyedProcessFunction):
    """A count per key in a state without TTL."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield (value.key, value.op, count, "null")


SESSION_TTL = {
    "spark.sql.streaming.stateStore.keyedstate.ttl.duration": "200ms",
    "spark.sql.streaming.stateStore.keyedstate.ttl.cleanup.incremental.size": "1000",
    "spark.sql.streaming.stateStore.keyedstate.ttl.cleanup.incremental.everyRecord": "true",
}


def test_session_ttl_defaults_do_not_reach_keyed_functions(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Session-wide ttl.* options are defaults for Spark's operators: a keyed function's state
    without TTL keeps its values past the session's duration (its families get duration=none)."""
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "ckpt"
    counts = []
    for key in SESSION_TTL:
        spark.conf.set(key, SESSION_TTL[key])
    try:
        for _ in range(2):
            source.add([{"key": "a", "op": "write", "n": 1}])
            frame = key_by(source.read_stream(spark), "key").process(PlainCount(), OUTPUT)
            collector = BatchCollector()
            query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
            await_finished(query)
            counts += [r["now"] for rows in collector.batches.values() for r in rows]
            time.sleep(0.6)  # three times the session's TTL
    finally:
        for key in SESSION_TTL:
            spark.conf.unset(key)
    assert counts == [1, 2], counts
    assert stored_state(spark, checkpoint, "count") == [{"key": "a", "value": 2}]


def test_expired_state_is_removed_by_the_providers_cleanup(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Keys written once and never again leave the store: the provider's incremental cleanup
    deletes them at a later commit (counted in its ttlRemovedIncremental metric), and the state
    operator's row count drops to the keys still live."""
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "ckpt"
    progresses = []
    for phase, rows in enumerate([[f"old{i}" for i in range(40)], ["new0"], ["new1"]]):
        source.add([{"key": k, "op": "write", "n": phase} for k in rows])
        frame = key_by(source.read_stream(spark), "key").process(Churn(), OUTPUT)
        collector = BatchCollector()
        query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
        await_finished(query)
        progresses += [p for p in query.recentProgress if p.numInputRows]
        time.sleep(0.8)  # past the TTL of everything written so far
    operators = [p.stateOperators[0] for p in progresses]
    removed = sum(int(o.customMetrics.get("ttlRemovedIncremental", 0)) for o in operators)
    assert removed == 41, [o.customMetrics for o in operators]  # the 40 old keys and new0
    assert operators[0].numRowsTotal == 40 and operators[-1].numRowsTotal == 1, operators
    # new1's last access is the time of the batch that wrote it (the last one).
    last = max(int(f.name) for f in (checkpoint / "offsets").iterdir() if f.name.isdigit())
    written = json.loads((checkpoint / "offsets" / str(last)).read_text().splitlines()[1])
    assert stored_state(spark, checkpoint, "seen") == [
        {"key": "new1", "value": 2, "last_access_timestamp": written["batchTimestampMs"]}
    ]
