"""Values of every Spark type through the API: input rows to Python values, Python values into
typed state and back across a restart, and Python values out to typed output columns."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

from keyedstate import (
    KeyedProcessFunction,
    RichMapFunction,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    key_by,
)
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from state_api_support import on_both_providers, run_jobs, ship_by_value, stored_state
from streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    start_query,
)

ship_by_value(__name__)

ITEM = StructType([StructField("a", LongType()), StructField("b", StringType())])
SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("n", LongType()),
        StructField("x", DoubleType()),
        StructField("flag", BooleanType()),
        StructField("when", TimestampType()),
        StructField("day", DateType()),
        StructField("price", DecimalType(10, 2)),
        StructField("tags", ArrayType(StringType())),
        StructField("counts", MapType(StringType(), LongType())),
        StructField("item", ITEM),
    ]
)
# The output: the previous element of the key (kept in state) next to the current one.
OUTPUT = StructType(
    [StructField("key", StringType()), StructField("seen", LongType())]
    + [StructField(f"prev_{f.name}", f.dataType) for f in SCHEMA.fields[1:]]
    + [StructField(f"cur_{f.name}", f.dataType) for f in SCHEMA.fields[1:]]
)


class PreviousAndCurrent(RichMapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        # The whole element, pickled; and its typed parts in typed states.
        self.previous = runtime_context.get_state(ValueStateDescriptor("previous"))
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))
        self.tags = runtime_context.get_state(ValueStateDescriptor("tags", list[str]))
        self.counts = runtime_context.get_state(ValueStateDescriptor("counts", dict[str, int]))
        self.when = runtime_context.get_state(ValueStateDescriptor("when", dt.datetime))
        self.price = runtime_context.get_state(ValueStateDescriptor("price", decimal.Decimal))

    def map(self, value: Any) -> tuple:  # noqa: ANN401
        previous = self.previous.value()
        if previous is not None:
            # Typed states hold the same values as the element kept whole.
            assert self.tags.value() == previous.tags, (self.tags.value(), previous)
            assert self.counts.value() == previous.counts
            assert self.when.value() == previous.when and self.price.value() == previous.price
            assert previous["key"] == value.key and previous.as_dict()["n"] == previous.n
        self.previous.update(value)
        self.seen.update((self.seen.value() or 0) + 1)
        self.tags.update(value.tags)
        self.counts.update(value.counts)
        self.when.update(value.when)
        self.price.update(value.price)
        before = tuple(previous[1:]) if previous is not None else (None,) * (len(value) - 1)
        return (value.key, self.seen.value(), *before, *value[1:])


def row(key: str, n: int | None, minute: int) -> dict[str, Any]:
    return {
        "key": key,
        "n": n,
        "x": None if n is None else n / 4,
        "flag": None if n is None else n % 2 == 0,
        "when": f"2024-03-01T10:{minute:02d}:30.250Z",
        "day": f"2024-03-{minute % 28 + 1:02d}",
        "price": f"{minute}.25",
        "tags": [f"t{minute}", None, "z"] if n else [],
        "counts": {"a": minute, "b": None} if n else {},
        "item": {"a": minute, "b": None if n is None else f"i{n}"},
    }


FILES = [
    [row("a", 1, 1), row("b", None, 2), row("a", 2, 3)],
    [row("b", 5, 4), row("c", 6, 5)],
    [row("a", 7, 6), row("c", None, 7)],
]


def expected_value(data: dict[str, Any], name: str) -> Any:  # noqa: ANN401
    """What the harness's normalized Spark output holds for an input JSON value."""
    value = data[name]
    if name == "when":
        return (
            dt.datetime.fromisoformat(value.replace("Z", "+00:00")).replace(tzinfo=None).isoformat()
        )
    if name == "price":
        return str(decimal.Decimal(value).quantize(decimal.Decimal("0.01")))
    if name == "item":
        return dict(value)
    return value


def test_every_type_round_trips_through_state_and_outputs(
    spark: SparkSession, tmp_path: Path
) -> None:
    results = run_jobs(
        spark,
        tmp_path,
        {"events": SCHEMA},
        [{"events": FILES[:2]}, {"events": FILES[2:]}],
        on_both_providers(
            lambda frames: key_by(frames["events"], "key").map(PreviousAndCurrent(), OUTPUT)
        ),
    )
    names = SCHEMA.names[1:]
    for label, result in results.items():
        previous: dict[str, dict[str, Any]] = {}
        seen: dict[str, int] = {}
        for batch, rows in enumerate(FILES):
            got = sorted(result.batches[batch], key=lambda r: (r["key"], r["seen"]))
            want = []
            for data in rows:
                seen[data["key"]] = seen.get(data["key"], 0) + 1
                out = {"key": data["key"], "seen": seen[data["key"]]}
                before = previous.get(data["key"])
                for name in names:
                    out[f"prev_{name}"] = None if before is None else expected_value(before, name)
                    out[f"cur_{name}"] = expected_value(data, name)
                previous[data["key"]] = data
                want.append(out)
            want.sort(key=lambda r: (r["key"], r["seen"]))
            assert got == want, f"{label} batch {batch}:\n{got}\n!=\n{want}"


class CountPerKey(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield repr(value.x), repr(value.item["x"]), count


def test_keys_spark_groups_as_one_are_one_key(spark: SparkSession, tmp_path: Path) -> None:
    """-0.0 and 0.0 (alone and inside a struct) are one key, as in Spark's groupBy: the
    function sees one key whose count runs through every element, in one batch and the next,
    and the state holds one entry. Keyed by their bytes they would be two keys, or one key
    whose elements the sort interleaves with the other's, read twice from the batch's state."""
    item = StructType([StructField("x", DoubleType())])
    schema = StructType([StructField("x", DoubleType()), StructField("item", item)])
    source = FileInput(tmp_path / "input", schema)
    checkpoint = tmp_path / "ckpt"
    signs = [-0.0, 0.0] * 40
    for _ in range(2):
        source.add([{"x": s, "item": {"x": -s}} for s in signs])
        frame = key_by(source.read_stream(spark), "x", "item").process(
            CountPerKey(), "x string, item_x string, count long"
        )
        collector = BatchCollector()
        query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
        await_finished(query)
    rows = [r for rows in collector.batches.values() for r in rows]
    assert sorted(r["count"] for r in rows) == list(range(81, 161)), rows
    assert {(r["x"], r["item_x"]) for r in rows} == {("0.0", "0.0")}, rows
    assert [r["value"] for r in stored_state(spark, checkpoint, "count")] == [160]
