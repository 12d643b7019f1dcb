"""Every keyed state type and every method, on real streaming queries, across a restart.

Each input row is an operation on one state of its key (``v.update``, ``l.add_all``, ``m.remove``,
``r.add``, ``a.add``, ...). After applying it the function emits what every state of the key
reads back. A plain-Python model applies the same operations to dicts; the per-batch outputs
must match it exactly on keyedstate's provider and on Spark's RocksDB provider. The key is two
columns (a tuple key), several keys share a bucket, and the second phase restarts the query so
state written before the restart is read after it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from keyedstate import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReduceFunction,
    ReducingStateDescriptor,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    key_by,
)
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.state_api_support import on_keyedstate, run_jobs, ship_by_value
from tests.support.streaming_harness import diff_batches, sort_rows

ship_by_value(__name__)

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("part", LongType()),
        StructField("seq", LongType()),
        StructField("op", StringType()),
        StructField("s", StringType()),
        StructField("n", LongType()),
    ]
)
OUTPUT = "key string, part long, seq long, view string"
OPS = [
    "v.update", "v.update", "v.clear", "v.update_none",
    "l.add", "l.add", "l.add_all", "l.update", "l.update_empty", "l.clear",
    "m.put", "m.put", "m.put_all", "m.remove", "m.setitem", "m.delitem", "m.clear",
    "r.add", "r.add", "r.clear",
    "a.add", "a.add", "a.clear",
    "read",
]  # fmt: skip


class Sum(ReduceFunction):
    def reduce(self, value1: int, value2: int) -> int:
        return value1 + value2


class Average(AggregateFunction):
    """Inputs are ints, the accumulator a (sum, count) tuple, the result a float."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[int, int]) -> float:
        return accumulator[0] / accumulator[1]


class AllStates(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.v = runtime_context.get_state(ValueStateDescriptor("v", Types.LONG()))
        self.l = runtime_context.get_list_state(ListStateDescriptor("l", Types.STRING()))
        self.m = runtime_context.get_map_state(MapStateDescriptor("m", str, int))
        self.r = runtime_context.get_reducing_state(
            ReducingStateDescriptor("r", Sum(), Types.LONG())
        )
        self.a = runtime_context.get_aggregating_state(
            AggregatingStateDescriptor("a", Average(), Types.TUPLE([Types.LONG(), Types.LONG()]))
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        op, s, n = value.op, value.s, value.n
        words = s.split(",") if s else []
        if op == "v.update":
            self.v.update(n)
        elif op == "v.clear":
            self.v.clear()
        elif op == "v.update_none":
            self.v.update(None)
        elif op == "l.add":
            self.l.add(s)
        elif op == "l.add_all":
            self.l.add_all(words)
        elif op == "l.update":
            self.l.update(words)
        elif op == "l.update_empty":
            self.l.update([])
        elif op == "l.clear":
            self.l.clear()
        elif op == "m.put":
            self.m.put(s, n)
        elif op == "m.put_all":
            self.m.put_all({w: n + i for i, w in enumerate(words)})
        elif op == "m.remove":
            self.m.remove(s)
        elif op == "m.setitem":
            self.m[s] = n
        elif op == "m.delitem":
            del self.m[s]
        elif op == "m.clear":
            self.m.clear()
        elif op == "r.add":
            self.r.add(n)
        elif op == "r.clear":
            self.r.clear()
        elif op == "a.add":
            self.a.add(n)
        elif op == "a.clear":
            self.a.clear()
        key = ctx.get_current_key()
        assert key == (value.key, value.part), (key, value)
        view = {
            "v": self.v.value(),
            "l": self.l.get(),
            "l_iter": list(self.l),
            "m": sorted(self.m.items()),
            "m_keys": sorted(self.m.keys()),
            "m_values": sorted(self.m.values()),
            "m_iter": sorted(self.m),
            "m_empty": self.m.is_empty(),
            "m_has_x": self.m.contains("x") and "x" in self.m,
            "m_x": self.m.get("x"),
            "m_y": self.m["y"],
            "r": self.r.get(),
            "a": self.a.get(),
        }
        yield (value.key, value.part, value.seq, json.dumps(view, sort_keys=True))


def files(seed: int, n_files: int, rows: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    keys = [("a", 1), ("a", 2), ("b", 1), ("c", 7), ("d", 3)]
    words = ["x", "y", "z", "w"]
    seq = 0
    out = []
    for _ in range(n_files):
        batch = []
        for _ in range(rows):
            key, part = rng.choice(keys)
            op = rng.choice(OPS)
            if op in ("l.add_all", "l.update", "m.put_all"):
                s = ",".join(rng.sample(words, rng.randrange(1, 4)))
            else:
                s = rng.choice(words)
            row = {"key": key, "part": part, "seq": seq, "op": op, "s": s,
                   "n": rng.randrange(-50, 100)}  # fmt: skip
            batch.append(row)
            seq += 1
        out.append(batch)
    return out


def model(all_files: list[list[dict[str, Any]]]) -> dict[int, list[dict[str, Any]]]:
    """The same operations on plain Python values."""
    state: dict[tuple[str, int], dict[str, Any]] = {}
    out = {}
    for batch, rows in enumerate(all_files):
        views = []
        for row in rows:
            st = state.setdefault((row["key"], row["part"]), {"l": [], "m": {}})
            op, s, n = row["op"], row["s"], row["n"]
            words = s.split(",") if s else []
            if op == "v.update":
                st["v"] = n
            elif op in ("v.clear", "v.update_none"):
                st.pop("v", None)
            elif op == "l.add":
                st["l"].append(s)
            elif op == "l.add_all":
                st["l"].extend(words)
            elif op == "l.update":
                st["l"] = list(words)
            elif op in ("l.update_empty", "l.clear"):
                st["l"] = []
            elif op in ("m.put", "m.setitem"):
                st["m"][s] = n
            elif op == "m.put_all":
                st["m"].update({w: n + i for i, w in enumerate(words)})
            elif op in ("m.remove", "m.delitem"):
                st["m"].pop(s, None)
            elif op == "m.clear":
                st["m"] = {}
            elif op == "r.add":
                st["r"] = st.get("r", 0) + n
            elif op == "r.clear":
                st.pop("r", None)
            elif op == "a.add":
                total, count = st.get("a", (0, 0))
                st["a"] = (total + n, count + 1)
            elif op == "a.clear":
                st.pop("a", None)
            m = st["m"]
            view = {
                "v": st.get("v"),
                "l": list(st["l"]),
                "l_iter": list(st["l"]),
                "m": sorted([k, v] for k, v in m.items()),
                "m_keys": sorted(m),
                "m_values": sorted(m.values()),
                "m_iter": sorted(m),
                "m_empty": not m,
                "m_has_x": "x" in m,
                "m_x": m.get("x"),
                "m_y": m.get("y"),
                "r": st.get("r"),
                "a": st["a"][0] / st["a"][1] if "a" in st else None,
            }
            views.append(
                {
                    "key": row["key"],
                    "part": row["part"],
                    "seq": row["seq"],
                    "view": json.dumps(view, sort_keys=True),
                }
            )
        out[batch] = sort_rows(views)
    return out


def test_every_state_type_and_method_across_a_restart(spark: SparkSession, tmp_path: Path) -> None:
    all_files = files(seed=11, n_files=4, rows=40)
    results = run_jobs(
        spark,
        tmp_path,
        {"events": SCHEMA},
        [{"events": all_files[:2]}, {"events": all_files[2:]}],
        on_keyedstate(
            lambda frames: key_by(
                frames["events"], "key", "part", order_by="seq"
            ).process(AllStates(), OUTPUT)
        ),
    )
    want = model(all_files)
    for label, result in results.items():
        assert result.batches == want, f"{label}:\n" + diff_batches(want, result.batches)
    # The scenario reaches every operation and keeps state across the restart.
    assert {row["op"] for rows in all_files for row in rows} == set(OPS)
    views_after_restart = [json.loads(r["view"]) for r in want[2]]
    assert any(v["l"] and v["m"] and v["a"] is not None for v in views_after_restart)
