"""Errors of the Python state API: before the query starts, with clear messages at run time, and
recovery: a micro-batch that fails half-way is replayed from the checkpoint exactly once."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    RichMapFunction,
    RuntimeContext,
    StateTtlConfig,
    StateTypeError,
    StateUsageError,
    Time,
    Types,
    ValueStateDescriptor,
    key_by,
)
from keyedstate.engine.planner import output_struct
from keyedstate.errors import InvalidOptionError, state_error
from keyedstate.keyed_stream import _state_type
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.support.drivers.spark_version_job import SparkCounter
from tests.support.state_api_support import PROVIDERS, ship_by_value
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    QUERY_TIMEOUT_S,
    REFERENCE_PROVIDER,
    BatchCollector,
    FileInput,
    await_finished,
    committed_batches,
    start_query,
)

ship_by_value(__name__)
ship_by_value(SparkCounter.__module__)  # a driver script's, not importable by the workers

SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.LongType())])


@pytest.fixture
def stream(spark: SparkSession, tmp_path: Path) -> DataFrame:
    source = FileInput(tmp_path / "input", SCHEMA)
    return source.read_stream(spark)


class Counter(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        count = (self.count.value() or 0) + value.v
        self.count.update(count)
        yield (value.k, count)


# ---------------------------------------------------------------------------------------------
# Before the query starts


class BadType(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        runtime_context.get_state(ValueStateDescriptor("x", set))

    def process_element(self, value: Any, ctx: Any) -> None:  # noqa: ANN401
        return None


class TwoKinds(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        runtime_context.get_state(ValueStateDescriptor("x", int))
        runtime_context.get_list_state(ListStateDescriptor("x", int))

    def process_element(self, value: Any, ctx: Any) -> None:  # noqa: ANN401
        return None


class WithTimer(Counter):
    def on_timer(self, timestamp: int, ctx: Any) -> None:  # noqa: ANN401
        return None


class Unpicklable(Counter):
    def __init__(self) -> None:
        self.lock = threading.Lock()


class AMap(RichMapFunction):
    def map(self, value: Any) -> Any:  # noqa: ANN401
        return value


def test_mistakes_fail_before_the_query_starts(spark: SparkSession, stream: DataFrame) -> None:
    keyed = key_by(stream, "k")
    with pytest.raises(StateTypeError, match="cannot map <class 'set'> to a Spark type"):
        keyed.process(BadType(), "k string")
    with pytest.raises(StateUsageError, match="'x' is already registered as ValueStateDescriptor"):
        keyed.process(TwoKinds(), "k string")
    with pytest.raises(TypeError, match="process_element"):
        keyed.process(AMap(), "k string")  # type: ignore[arg-type]
    with pytest.raises(StateUsageError, match="no column 'user'"):
        key_by(stream, "user").process(Counter(), "k string, n long")
    with pytest.raises(StateUsageError, match="no column 'seq'"):
        key_by(stream, "k", order_by="seq").process(Counter(), "k string, n long")
    nested_map = stream.withColumn("m", F.struct(F.create_map("k", "v").alias("kv")))
    with pytest.raises(StateUsageError, match="'m' is struct<kv:map<string,bigint>>; a map cannot"):
        key_by(nested_map, "m").process(Counter(), "k string, n long")
    # Collated strings equal under the collation differ in bytes; nested ones count too.
    collated = stream.withColumn("c", F.struct(F.col("k").cast("string collate UTF8_LCASE")))
    with pytest.raises(StateUsageError, match="of collation UTF8_LCASE can be equal with differ"):
        key_by(collated, "c").process(Counter(), "k string, n long")
    with pytest.raises(StateUsageError, match="needs an event-time watermark"):
        keyed.process(WithTimer(), "k string, n long", timer_mode="event")
    with pytest.raises(StateTypeError, match="cannot parse output schema"):
        keyed.process(Counter(), "k string, n lung")
    with pytest.raises(StateUsageError, match="cannot be shipped to executors"):
        keyed.process(Unpicklable(), "k string, n long")
    with pytest.raises(StateUsageError, match="streaming DataFrames"):
        key_by(spark.range(3).withColumnRenamed("id", "k"), "k").process(Counter(), "k long")
    with pytest.raises(TypeError, match="must take \\(value, state\\)"):
        keyed.map_with_state(lambda value: value, "k string")
    with pytest.raises(StateUsageError, match="timers are only available to KeyedProcessFunction"):
        keyed._build("map", AMap(), "k string", timer_mode="processing")


def test_declared_python_types_map_to_spark_types(stream: DataFrame) -> None:
    assert output_struct([("k", str), ("n", int), ("xs", list[float]), ("m", dict[str, int])]) == (
        T.StructType(
            [
                T.StructField("k", T.StringType()),
                T.StructField("n", T.LongType()),
                T.StructField("xs", T.ArrayType(T.DoubleType())),
                T.StructField("m", T.MapType(T.StringType(), T.LongType())),
            ]
        )
    )
    assert output_struct({"k": Types.STRING(), "when": T.TimestampType()}).names == ["k", "when"]

    def running(value: Any, count: int | None) -> tuple[Any, int | None]:  # noqa: ANN401
        return value, count

    assert _state_type(running, None) == Types.LONG()
    assert _state_type(lambda value, state: (value, state), None).is_pickled()
    # A watermark column is found, so on_timer picks event-time timers by default.
    watermarked = stream.withColumn("ts", F.timestamp_seconds("v")).withWatermark("ts", "1 second")
    assert key_by(watermarked, "k").process(WithTimer(), "k string, n long").isStreaming


# ---------------------------------------------------------------------------------------------
# At run time


class WrongValue(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        self.count.update(f"{value.v}")
        yield (value.k, 1)


class WrongOutput(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        yield (value.k, str(value.v))


def failure_of(spark: SparkSession, workdir: Path, frame: DataFrame) -> str:
    query = start_query(
        spark, PROVIDER_UNDER_TEST, frame, "append", workdir / "checkpoint", BatchCollector()
    )
    with pytest.raises(StreamingQueryException) as failure:
        await_finished(query)
    return str(failure.value)


def test_wrong_values_fail_with_the_state_or_column_named(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"k": "a", "v": 1}])
    keyed = key_by(source.read_stream(spark), "k")
    message = failure_of(spark, tmp_path / "q1", keyed.process(WrongValue(), "k string, n long"))
    assert "ValueState 'count' holds: expected LONG (int), got str '1'" in message
    message = failure_of(spark, tmp_path / "q2", keyed.process(WrongOutput(), "k string, n long"))
    assert "output column 'n' is bigint, got str '1'" in message


def test_changing_the_key_columns_of_a_checkpoint_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    rows = [{"k": f"k{i}", "v": i} for i in range(20)]
    source.add(rows)
    checkpoint = tmp_path / "checkpoint"
    first = key_by(source.read_stream(spark), "k").process(Counter(), "k string, n long")
    await_finished(
        start_query(spark, PROVIDER_UNDER_TEST, first, "append", checkpoint, BatchCollector())
    )
    source.add(rows)
    again = key_by(source.read_stream(spark), "v").process(Counter(), "k string, n long")
    collector = BatchCollector()
    query = start_query(spark, PROVIDER_UNDER_TEST, again, "append", checkpoint, collector)
    with pytest.raises(StreamingQueryException) as failure:
        await_finished(query)
    message = str(failure.value)
    assert "KEYED_FUNCTION_KEY_CHANGED" in message, message
    assert "keyed by [k string] on this checkpoint and is now keyed by [v bigint]" in message
    # Refused before its first batch: nothing ran, nothing was written for the new key.
    assert collector.batches == {}, collector.batches
    assert committed_batches(checkpoint) == [0]


class Buggy(Counter):
    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        yield (value.k, value.v // 0)  # the user's bug


def worker_traceback(message: str) -> list[str]:
    """The Python worker's traceback in a failure's text: its lines from the worker's
    ``Traceback (most recent call last):`` to the exception's line."""
    lines = message.splitlines()
    start = next(
        i for i, line in enumerate(lines)
        if line.endswith("Traceback (most recent call last):") and "runner.py" in lines[i + 1]
    )
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("ZeroDivisionError"))
    return lines[start : end + 1]


def test_a_failing_function_shows_its_own_frame(spark: SparkSession, tmp_path: Path) -> None:
    """Each frame of the traceback a user reads shows the line it was at when the function
    failed: the engine's frames the calls that led to the function, then the function's line;
    never the engine's clean-up after it (``gc.unfreeze()`` was the first frame)."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"k": "a", "v": 1}])
    frame = key_by(source.read_stream(spark), "k").process(Buggy(), "k string, n long")
    message = failure_of(spark, tmp_path, frame)
    assert "gc.unfreeze" not in message, message
    traceback = worker_traceback(message)
    frames = [(line.strip(), traceback[i + 1].strip()) for i, line in enumerate(traceback)
              if line.lstrip().startswith('File "')]
    assert frames[0][0].endswith("in __call__"), traceback
    assert frames[0][1] == "yield from task.run(batches)", traceback
    assert frames[-1][0].endswith("in process_element"), traceback
    assert frames[-1][1] == "yield (value.k, value.v // 0)  # the user's bug", traceback
    assert traceback[-1] == "ZeroDivisionError: integer division or modulo by zero", traceback


class FailOnce(Counter):
    """Fails the first time it meets a row with v == 99 (the marker file says it has not yet)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        if value.v == 99 and os.path.exists(self.marker):
            os.remove(self.marker)
            raise RuntimeError("injected failure")
        yield from super().process_element(value, ctx)


def run_fail_once(
    spark: SparkSession, provider: str, workdir: Path, collector: BatchCollector, fails: bool
) -> None:
    source = FileInput(workdir / "input", SCHEMA)
    frame = key_by(source.read_stream(spark), "k").process(
        FailOnce(str(workdir / "fail-once")), "k string, n long"
    )
    query = start_query(spark, provider, frame, "append", workdir / "checkpoint", collector)
    if fails:
        with pytest.raises(StreamingQueryException, match="injected failure"):
            await_finished(query)
    else:
        await_finished(query)


def test_a_failed_batch_is_replayed_exactly_once(spark: SparkSession, tmp_path: Path) -> None:
    files = [
        [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "c", "v": 3}],
        [{"k": "a", "v": 10}, {"k": "c", "v": 99}, {"k": "b", "v": 20}],
        [{"k": "a", "v": 100}, {"k": "c", "v": 1}],
    ]
    want = {
        0: [{"k": "a", "n": 1}, {"k": "b", "n": 2}, {"k": "c", "n": 3}],
        1: [{"k": "a", "n": 11}, {"k": "b", "n": 22}, {"k": "c", "n": 102}],
        2: [{"k": "a", "n": 111}, {"k": "c", "n": 103}],
    }
    for label, provider in PROVIDERS.items():
        workdir = tmp_path / label
        source = FileInput(workdir / "input", SCHEMA)
        collector = BatchCollector()
        source.add(files[0])
        run_fail_once(spark, provider, workdir, collector, fails=False)
        (workdir / "fail-once").touch()
        source.add_all(files[1:])
        run_fail_once(spark, provider, workdir, collector, fails=True)
        assert not (workdir / "fail-once").exists()
        run_fail_once(spark, provider, workdir, collector, fails=False)
        assert collector.batches == want, (label, collector.batches)


# ---------------------------------------------------------------------------------------------
# The state layer's own checks (no Spark)


def test_types_check_and_normalise_values() -> None:
    long = Types.LONG()
    assert long.coerce(3) == 3
    with pytest.raises(StateTypeError, match="out of range for LONG"):
        long.coerce(2**63)
    with pytest.raises(StateTypeError, match="expected LONG"):
        long.coerce(True)
    assert Types.DOUBLE().coerce(2) == 2.0 and isinstance(Types.DOUBLE().coerce(2), float)
    assert Types.LIST(int).coerce((1, 2)) == [1, 2]
    with pytest.raises(StateTypeError, match="expected STRING"):
        Types.MAP(str, int).coerce({1: 2})
    row = Types.ROW_NAMED(["a", "b"], [int, str]).coerce({"a": 1, "b": "x"})
    assert row.a == 1 and row.b == "x"
    assert Types.TUPLE([int, str]).spark_type() == T.StructType(
        [T.StructField("f0", T.LongType()), T.StructField("f1", T.StringType())]
    )
    assert Types.PRIMITIVE_ARRAY(Types.BYTE()).spark_type() == T.BinaryType()
    descriptor = MapStateDescriptor("m", str, list[int])
    assert descriptor.type_info.spark_type() == T.MapType(T.StringType(), T.ArrayType(T.LongType()))


def test_list_update_checks_every_element_it_has_not_stored() -> None:
    """update() skips a second check only for the stored elements of an immutable type it is
    given back (get(), change, update()); new, replaced or mutable elements are all checked."""
    from keyedstate.engine.keyed_state import KeyState

    keys = KeyState()
    pairs = keys.register(ListStateDescriptor("pairs", Types.TUPLE([int, int])), "list")
    nested = keys.register(ListStateDescriptor("nested", Types.LIST(int)), "list")
    keys.load("k", {})
    pairs.update([(1, 2), (3, 4)])
    kept = pairs.get()
    pairs.update([*kept[1:], (5, 6)])  # dropped from the front, appended
    assert pairs.get() == [(3, 4), (5, 6)]
    with pytest.raises(StateTypeError, match="ListState 'pairs' element"):
        pairs.update([*pairs.get(), (7, "x")])
    with pytest.raises(StateTypeError, match="ListState 'pairs' element"):
        pairs.update([(1.5, 2), *pairs.get()])  # a bad element before the stored ones
    assert pairs.get() == [(3, 4), (5, 6)]
    with pytest.raises(StateTypeError, match="expected LONG"):
        pairs.update([(3, 4), (5.0, 6)])  # equal to a stored element, not the same object
    with pytest.raises(StateTypeError, match="ListState 'pairs': cannot add None"):
        pairs.update([*pairs.get(), None])
    stored = pairs.get()
    with pytest.raises(StateTypeError, match="ListState 'pairs' element"):
        pairs.update([stored[0], (1, "y"), stored[1]])  # a bad element between stored ones
    assert pairs.get() == [(3, 4), (5, 6)]
    nested.update([[1], [2]])
    inner = nested.get()
    inner[0].append("x")  # a mutable element changed in place is checked again
    with pytest.raises(StateTypeError, match="ListState 'nested' element"):
        nested.update(inner)


def test_ttl_config_builder_mirrors_pyflink() -> None:
    config = StateTtlConfig.new_builder(Time.seconds(10)).build()
    assert config.get_ttl().to_milliseconds() == 10_000
    assert config.get_update_type() is StateTtlConfig.UpdateType.OnCreateAndWrite
    assert config.get_state_visibility() is StateTtlConfig.StateVisibility.NeverReturnExpired
    assert config.get_cleanup_strategies().is_cleanup_in_background()
    config = (
        StateTtlConfig.new_builder(Time.minutes(1))
        .set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)
        .set_state_visibility(StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp)
        .cleanup_full_snapshot()
        .cleanup_incrementally(5, True)
        .cleanup_in_rocksdb_compact_filter(1000)
        .build()
    )
    strategies = config.get_cleanup_strategies()
    assert strategies.in_full_snapshot()
    assert strategies.get_incremental_cleanup_strategy().cleanup_size == 5
    assert strategies.get_rocksdb_compact_filter_cleanup_strategy() is not None
    assert config.update_on_read and config.return_expired
    disabled = StateTtlConfig.new_builder(Time.seconds(1)).set_update_type(
        StateTtlConfig.UpdateType.Disabled
    )
    descriptor = ValueStateDescriptor("v", int)
    descriptor.enable_time_to_live(disabled.build())
    assert descriptor.ttl_config is None
    with pytest.raises(ValueError, match="TTL must be positive"):
        StateTtlConfig.new_builder(Time.seconds(0)).build()


@pytest.mark.parametrize(
    "provider",
    [
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
        # Column families and scans, but no manifest to keep the declaration with the state.
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    ],
)
def test_other_providers_are_refused(spark: SparkSession, tmp_path: Path, provider: str) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"k": "a", "v": 1}])
    frame = key_by(source.read_stream(spark), "k").process(Counter(), "k string, n long")
    collector = BatchCollector()
    query = start_query(spark, provider, frame, "append", tmp_path / "checkpoint", collector)
    with pytest.raises(StreamingQueryException) as failure:
        await_finished(query)
    message = str(failure.value)
    assert "KEYED_FUNCTION_UNSUPPORTED_PROVIDER" in message and provider in message, message
    assert "io.keyedstate.KeyedStateStoreProvider" in message and collector.batches == {}


def test_sparks_transform_with_state_is_refused_on_keyedstates_provider(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark 4.3 refuses other providers for it when the query plans; keyedstate refuses it
    first, with one error on every Spark version (tests/versions/), and with the provider the
    query's checkpoint pins: a checkpoint of Spark's RocksDB provider restarts in a session
    set to keyedstate's."""
    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key)
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"k": "a", "v": 1}])

    def run(checkpoint: Path) -> None:
        frame = source.read_stream(spark).groupBy("k").transformWithStateInPandas(
            SparkCounter(), "k string, c long", "append", "None"
        )
        query = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(QUERY_TIMEOUT_S)
        if query.exception() is not None:
            raise query.exception()

    try:
        spark.conf.set(key, keyedstate.PROVIDER_CLASS)
        with pytest.raises(Exception) as failure:  # noqa: PT011 - mapped and checked below
            run(tmp_path / "checkpoint")
        spark.conf.set(key, REFERENCE_PROVIDER)
        run(tmp_path / "rocksdb")
        source.add([{"k": "a", "v": 2}])
        spark.conf.set(key, keyedstate.PROVIDER_CLASS)
        run(tmp_path / "rocksdb")  # the checkpoint's provider: Spark's RocksDB one
    finally:
        spark.conf.set(key, before)
    mapped = state_error(failure.value)
    assert isinstance(mapped, InvalidOptionError), failure.value
    assert mapped.error_id == "KEYEDSTATE_TRANSFORM_WITH_STATE_PROVIDER"
    assert "keyedstate.key_by(...).process(...)" in str(mapped)
    assert not (tmp_path / "checkpoint" / "commits" / "0").exists()
    assert (tmp_path / "rocksdb" / "commits" / "1").exists()


@pytest.mark.parametrize("name", ["default", "_hidden", "$op", " padded", "trailing "])
def test_state_names_a_state_store_refuses_are_refused_when_declared(name: str) -> None:
    with pytest.raises(StateUsageError, match=re.escape(repr(name))):
        ValueStateDescriptor(name, Types.LONG())
