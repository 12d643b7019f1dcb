"""Values of every Spark type through the API: input rows to Python values, Python values into
typed state and back across a restart, and Python values out to typed output columns."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle
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
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
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

from tests.support.state_api_support import (
    batch_metadata,
    on_keyedstate,
    run_jobs,
    ship_by_value,
    stored_state,
)
from tests.support.streaming_harness import (
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
        on_keyedstate(
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


# Flink's CountWithTimeoutFunction (the ProcessFunction documentation's example): its state is a
# row with a field named `count`, which a tuple also has as a method.
COUNT_WITH_TIMESTAMP = Types.ROW_NAMED(
    ["key", "count", "last_modified"], [Types.STRING(), Types.LONG(), Types.LONG()]
)


class CountWithTimeout(KeyedProcessFunction):
    """A count per key and the event time of its last element; a key silent for a minute of event
    time emits (key, count, last_modified)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(
            ValueStateDescriptor("my_state", COUNT_WITH_TIMESTAMP)
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> None:  # noqa: ANN401
        current = self.state.value()
        count = 0 if current is None else current.count
        self.state.update((value.key, count + 1, ctx.timestamp()))
        current = self.state.value()
        # Still a Row for everything else: by name, by position, as a dict, equal to a tuple.
        assert isinstance(current, Row) and isinstance(current.count, int)
        assert current["count"] == current[1] == count + 1
        assert current.asDict() == {"key": value.key, "count": count + 1,
                                    "last_modified": ctx.timestamp()}
        assert current == (value.key, count + 1, ctx.timestamp())
        ctx.timer_service().register_event_time_timer(current.last_modified + 60_000)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:  # noqa: ANN401
        result = self.state.value()
        if timestamp == result.last_modified + 60_000:
            yield (result.key, result.count, result.last_modified)


TIMEOUT_SCHEMA = StructType([StructField("key", StringType()), StructField("t", LongType())])


def test_a_row_field_named_count_reads_as_the_field(spark: SparkSession, tmp_path: Path) -> None:
    """Across a restart: the state row comes back from the store with ``count`` its field; a
    minute of event time after a key's last element, its timer emits the key's count."""

    def build(frames: Any) -> Any:  # noqa: ANN401
        events = frames["events"].withColumn("ts", F.timestamp_seconds("t"))
        events = events.withWatermark("ts", "0 seconds")
        return key_by(events, "key", order_by="t").process(
            CountWithTimeout(), "key string, count long, last_modified long"
        )

    phases = [
        {"events": [[{"key": "a", "t": 0}, {"key": "a", "t": 10}, {"key": "b", "t": 5}],
                    [{"key": "a", "t": 30}]]},
        {"events": [[{"key": "b", "t": 100}, {"key": "c", "t": 200}]]},
    ]
    result = run_jobs(
        spark, tmp_path, {"events": TIMEOUT_SCHEMA}, phases,
        {"keyedstate": (PROVIDER_UNDER_TEST, build)},
    )["keyedstate"]
    # The last batch is the no-data batch at watermark 200 s: a's timer at 90 s and b's at
    # 160 s find their key silent since; b's at 65 s and c's at 260 s emit nothing or are not due.
    assert batch_metadata(result.checkpoint)[3][0] == 200_000
    assert result.collector.non_empty() == {
        3: [  # in the harness's order (sort_rows)
            {"key": "b", "count": 2, "last_modified": 100_000},
            {"key": "a", "count": 3, "last_modified": 30_000},
        ]
    }
    assert stored_state(spark, result.checkpoint, "my_state") == [
        {"key": "a", "value": {"key": "a", "count": 3, "last_modified": 30_000}},
        {"key": "b", "value": {"key": "b", "count": 2, "last_modified": 100_000}},
        {"key": "c", "value": {"key": "c", "count": 1, "last_modified": 200_000}},
    ]


def test_row_fields_named_like_tuple_methods_read_as_the_fields() -> None:
    """``count`` and ``index`` are fields of the row, in a dict or a tuple given to the state, and
    after pickling (a row kept in a pickled state, or shipped)."""
    info = Types.ROW_NAMED(["index", "count"], [Types.LONG(), Types.STRING()])
    for given in ((7, "x"), [7, "x"], {"count": "x", "index": 7}):
        row = info.coerce(given)
        assert (row.index, row.count) == (7, "x"), row
        assert isinstance(row, Row) and row == (7, "x") and repr(row) == "Row(index=7, count='x')"
        again = pickle.loads(pickle.dumps(row))
        assert (again.index, again.count, type(again)) == (7, "x", type(row))
