"""The Flink tutorial examples, written with keyedstate's API.

Each one is the Python form of a listing from the Flink state tutorials this project follows:

* :class:`MinimumTracker` - the ``leastValue`` ValueState in a RichFlatMapFunction;
* :class:`TemperatureAlert` and :func:`temperature_alert` - the ``lastTemp`` alert as a
  RichFlatMapFunction and as ``flat_map_with_state``;
* :func:`running_count` - the ``mapWithState`` running count;
* :class:`CheckpointCount` - keyed state and operator state (``CheckpointedFunction``).

Run them all on a small stream (a script, or ``examples.run(spark)`` in a notebook)::

    python -m keyedstate.examples

One difference from the Scala listings: an empty ``ValueState[Long]`` reads as ``0`` in Scala
(an unboxed null) and as ``None`` here (as in PyFlink), so the first element of a key is handled
explicitly instead of being compared with 0.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from keyedstate.functions import (
    CheckpointedFunction,
    FlatMapFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    RichFlatMapFunction,
    RuntimeContext,
)
from keyedstate.keyed_stream import key_by
from keyedstate.state import ListState, ListStateDescriptor, Types, ValueState, ValueStateDescriptor

__all__ = [
    "CheckpointCount",
    "MinimumTracker",
    "TemperatureAlert",
    "run",
    "running_count",
    "temperature_alert",
]

PAIRS = StructType([StructField("key", LongType()), StructField("value", LongType())])
READINGS = StructType([StructField("id", StringType()), StructField("temperature", DoubleType())])


class MinimumTracker(RichFlatMapFunction):
    """Emits ``(key, value, least value so far)``: the ``leastValue`` listing."""

    least_value_state: ValueState

    def open(self, runtime_context: RuntimeContext) -> None:
        least_value_descriptor = ValueStateDescriptor("leastValue", Types.LONG())
        self.least_value_state = runtime_context.get_state(least_value_descriptor)

    def flat_map(self, value: Any) -> Iterator[tuple[int, int, int]]:  # noqa: ANN401
        least_value = self.least_value_state.value()
        if least_value is not None and value.value > least_value:
            yield (value.key, value.value, least_value)
        else:
            self.least_value_state.update(value.value)
            yield (value.key, value.value, value.value)


class TemperatureAlert(RichFlatMapFunction):
    """Emits ``(sensor, temperature, jump)`` when a sensor's temperature jumps by more than the
    threshold since its last reading: the ``lastTemp`` listing."""

    last_temp_state: ValueState

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def open(self, runtime_context: RuntimeContext) -> None:
        last_temp_descriptor = ValueStateDescriptor("lastTemp", Types.DOUBLE())
        self.last_temp_state = runtime_context.get_state(last_temp_descriptor)

    def flat_map(self, reading: Any) -> Iterator[tuple[str, float, float]]:  # noqa: ANN401
        last_temp = self.last_temp_state.value()
        if last_temp is not None:
            temp_diff = abs(reading.temperature - last_temp)
            if temp_diff > self.threshold:
                yield (reading.id, reading.temperature, temp_diff)
        self.last_temp_state.update(reading.temperature)


def temperature_alert(
    reading: Any,  # noqa: ANN401
    last_temp: float | None,
) -> tuple[list[tuple[str, float, float]], float | None]:
    """The same alert with ``flat_map_with_state`` (threshold 1.7)."""
    if last_temp is None:
        return [], reading.temperature
    temp_diff = abs(reading.temperature - last_temp)
    if temp_diff > 1.7:
        return [(reading.id, reading.temperature, temp_diff)], reading.temperature
    return [], reading.temperature


def running_count(value: Any, count: int | None) -> tuple[tuple[int, int], int | None]:  # noqa: ANN401
    """``mapWithState``: emits ``(key, sum before this element)`` and keeps the running sum."""
    if count is None:
        return (value.key, 0), value.value
    return (value.key, count), count + value.value


class CheckpointCount(FlatMapFunction, CheckpointedFunction):
    """Counts elements per key (keyed state) and per parallel instance (operator state).

    Here a parallel instance is a state partition (Spark's shuffle partitions), so
    ``operator_count`` counts the elements of the keys of one partition.
    """

    keyed_state: ValueState
    operator_state: ListState

    def __init__(self) -> None:
        self.operator_count = 0

    def flat_map(self, value: Any) -> Iterator[tuple[int, int, int]]:  # noqa: ANN401
        keyed_count = (self.keyed_state.value() or 0) + 1
        self.keyed_state.update(keyed_count)
        self.operator_count += 1
        yield (value.key, keyed_count, self.operator_count)

    def initialize_state(self, context: FunctionInitializationContext) -> None:
        self.keyed_state = context.get_keyed_state_store().get_state(
            ValueStateDescriptor("keyedState", Types.LONG())
        )
        self.operator_state = context.get_operator_state_store().get_list_state(
            ListStateDescriptor("operatorState", Types.LONG())
        )
        if context.is_restored():
            self.operator_count = sum(self.operator_state.get())

    def snapshot_state(self, context: FunctionSnapshotContext) -> None:
        self.operator_state.clear()
        self.operator_state.add(self.operator_count)


# ---------------------------------------------------------------------------------------------
# Running the examples


def build_all(pairs: DataFrame, readings: DataFrame) -> dict[str, DataFrame]:
    """The streaming DataFrames of every example (pairs: key, value; readings: id, temperature)."""
    keyed = key_by(pairs, "key")
    sensors = key_by(readings, "id")
    return {
        "minimum": keyed.flat_map(MinimumTracker(), "key long, value long, least long"),
        "running_count": keyed.map_with_state(running_count, "key long, count long"),
        "checkpoint_count": keyed.flat_map(
            CheckpointCount(), "key long, keyed_count long, operator_count long"
        ),
        "alert": sensors.flat_map(
            TemperatureAlert(1.7), "id string, temperature double, diff double"
        ),
        "alert_with_state": sensors.flat_map_with_state(
            temperature_alert, "id string, temperature double, diff double"
        ),
    }


def run(spark: SparkSession, workdir: str | None = None) -> dict[str, list[tuple]]:
    """Runs every example on the tutorials' inputs and returns (and prints) their outputs."""
    import json

    base = Path(workdir or tempfile.mkdtemp(prefix="keyedstate-examples-"))
    inputs = {
        "pairs": [
            {"key": 2, "value": 21},
            {"key": 4, "value": 1},
            {"key": 5, "value": 4},
            {"key": 2, "value": 3},
            {"key": 4, "value": 7},
            {"key": 2, "value": 30},
        ],
        "readings": [
            {"id": "s1", "temperature": 20.0},
            {"id": "s2", "temperature": 15.0},
            {"id": "s1", "temperature": 21.0},
            {"id": "s1", "temperature": 23.5},
            {"id": "s2", "temperature": 14.0},
            {"id": "s2", "temperature": 11.0},
        ],
    }
    for name, rows in inputs.items():
        (base / name).mkdir(parents=True, exist_ok=True)
        with (base / name / "part-0.json").open("w") as out:
            out.writelines(json.dumps(r) + "\n" for r in rows)
    pairs = spark.readStream.schema(PAIRS).json(str(base / "pairs"))
    readings = spark.readStream.schema(READINGS).json(str(base / "readings"))
    results: dict[str, list[tuple]] = {}
    for name, frame in build_all(pairs, readings).items():
        collected: list[tuple] = []

        def collect(batch: DataFrame, _batch_id: int, into: list[tuple] = collected) -> None:
            into.extend(tuple(r) for r in batch.collect())

        query = (
            frame.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(base / "checkpoints" / name))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        results[name] = sorted(collected)
        print(f"{name}: {results[name]}")
    return results


def main() -> None:
    from keyedstate._session import configure

    spark = configure(SparkSession.builder.master("local[2]").appName("keyedstate-examples"))
    session = spark.config("spark.sql.shuffle.partitions", "2").getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    run(session)
    session.stop()


if __name__ == "__main__":
    main()
