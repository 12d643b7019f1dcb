"""State TTL on real streaming queries: update types, visibility, per-element TTL, cleanup.

TTL runs on processing time, which is each micro-batch's timestamp. The query runs on a
processing-time trigger and gets one input file per micro-batch at planned moments (so some
values are read before their TTL and some after), with a restart in the middle. Every output
row carries its batch's processing time, and the expected outputs are computed in plain Python
from those times, so the check is exact whatever the machine's speed. Then the stored state is
read back from the checkpoint (Spark's state data source) to check what each cleanup strategy
removed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType
from state_api_support import TimedRun, on_both_providers, ship_by_value, stored_buckets
from streaming_harness import sort_rows

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
                del st[name]
                view[name] = entry[0] if return_expired else None
            else:
                view[name] = entry[0]
                if refresh:
                    st[name] = (entry[0], now)
        st["lst"] = [e for e in st["lst"] if not self.expired(e[1], now)]
        view["lst"] = [v for v, _ in st["lst"]]
        st["mp"] = {k: (v, now) for k, (v, ts) in st["mp"].items() if not self.expired(ts, now)}
        view["mp"] = sorted([k, v] for k, (v, _) in st["mp"].items())
        return view

    def purge(self, now: int) -> None:
        """End of a batch: states with background/full-snapshot/incremental cleanup lose their
        expired entries in every key of the (single) bucket; 'ret' keeps them."""
        for st in self.keys.values():
            for name in ("cw", "rw"):
                if name in st and self.expired(st[name][1], now):
                    del st[name]
            st["lst"] = [e for e in st["lst"] if not self.expired(e[1], now)]
            st["mp"] = {k: e for k, e in st["mp"].items() if not self.expired(e[1], now)}


def test_ttl_update_types_visibility_and_cleanup(spark: SparkSession, tmp_path: Path) -> None:
    run = TimedRun(
        spark,
        tmp_path,
        SCHEMA,
        on_both_providers(
            lambda frames: key_by(frames["events"], "key", buckets=1).process(TtlProbe(), OUTPUT)
        ),
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
            model.purge(now)
            assert got == sort_rows(want), f"{label} batch {batch}: {got} != {sort_rows(want)}"

        # What is stored after the last batch: cleanup removed expired entries of untouched keys
        # ('idle' was written once, 26 s before), except for the state without cleanup.
        stored = stored_buckets(spark, result.checkpoint)
        assert list(stored) == [0], (label, list(stored))
        records = stored[0]["keys"]
        assert set(records["idle"]) == {"ret"}, (label, records["idle"])
        for key, st in model.keys.items():
            live = {name for name in ("cw", "rw", "ret") if name in st}
            live |= {name for name in ("lst", "mp") if st[name]}
            assert set(records.get(key, {})) == live, (label, key, records.get(key), live)

    # The timeline exercised both sides of every rule (timing is planned with seconds of margin).
    assert {
        "cw:live", "cw:gone", "rw:live", "rw:gone", "lst:live", "lst:gone", "mp:live", "mp:gone",
        "rw kept alive by reads", "ret returned expired",
    } <= coverage, coverage  # fmt: skip
