"""A restart with an incompatible state schema fails before it touches the state, naming both
schemas; keyedstate's keyed functions also name the operator."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import KeyedProcessFunction, RuntimeContext, Types, ValueStateDescriptor
from pyspark.errors import StreamingQueryException
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from tests.support.state_api_support import ship_by_value


def state_files(directory: Path) -> list[str]:
    """The files under a state directory, but the store leases: a stopped run releases its own."""
    return sorted(p.name for p in directory.rglob("*") if "keyedstate-lease" not in p.name)


@pytest.mark.parametrize(
    ("change", "error", "existing", "new"),
    [
        ("aggregation", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
         "StructField(count,LongType,true)", "StructField(sum,DoubleType,true)"),
        ("key type", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", "StructField(k,LongType,true)",
         "StringType"),
    ],
)
def test_an_incompatible_state_schema_on_restart_fails_naming_both_schemas(
    spark: SparkSession, tmp_path: Path, change: str, error: str, existing: str, new: str
) -> None:
    changed: dict[str, tuple[Column, Column]] = {
        "aggregation": (F.avg("v"), F.col("k")),
        "key type": (F.count("*"), F.col("k").cast("string").alias("k")),
    }
    aggregate, key = changed[change]
    source, checkpoint = tmp_path / "in", tmp_path / "ck"

    def run(agg: Column, by: Column) -> None:
        spark.range(20).selectExpr("id % 5 as k", "id as v").write.mode("append").parquet(
            str(source)
        )
        query = (
            spark.readStream.schema("k long, v long").parquet(str(source)).groupBy(by).agg(agg)
            .writeStream.format("noop").outputMode("update")
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )
        query.awaitTermination(180)

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", keyedstate.PROVIDER_CLASS)
    run(F.count("*"), F.col("k"))
    state_before = state_files(checkpoint / "state" / "0" / "0")
    with pytest.raises(StreamingQueryException) as failure:
        run(aggregate, key)
    message = str(failure.value)
    assert error in message and existing in message and new in message, (change, message)
    assert state_files(checkpoint / "state" / "0" / "0") == state_before
    # Spark's message does not name the operator; given the checkpoint, keyedstate does.
    assert keyedstate.state_error(failure.value) is None
    # Read as a listener or another thread would: with no session active in this thread.
    spark._jvm.org.apache.spark.sql.SparkSession.clearActiveSession()  # type: ignore[union-attr]
    try:
        named = keyedstate.state_error(failure.value, checkpoint=checkpoint)
    finally:
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)  # type: ignore[union-attr]
    assert isinstance(named, keyedstate.StateSchemaError), message[:3000]
    assert named.error_id == error and named.__cause__ is failure.value
    line = str(named)
    assert line.startswith(
        f"[{error}] the state of stateful operator 0 (stateStoreSave: streaming aggregation, "
        "state store 'default') does not fit the restarted query: its stored "
    ), line
    assert existing in line and new in line and "\n" not in line, line


# -- the Python API's keyed functions: keyedstate's own check names the operator -------------


class Count(KeyedProcessFunction):
    """Counts per key in a state ``count`` declared as a long, or (``as_text``) as a string: the
    same function with its state's type changed."""

    def __init__(self, as_text: bool = False) -> None:
        self.as_text = as_text

    def open(self, runtime_context: RuntimeContext) -> None:
        declared = Types.STRING() if self.as_text else Types.LONG()
        self.count = runtime_context.get_state(ValueStateDescriptor("count", declared))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        if self.as_text:
            text = (self.count.value() or "") + "x"
            self.count.update(text)
            yield (value.k, len(text))
        else:
            count = (self.count.value() or 0) + 1
            self.count.update(count)
            yield (value.k, count)


ship_by_value(__name__)


@pytest.mark.parametrize(
    ("change", "error_id", "says"),
    [
        ("state type", "KEYED_FUNCTION_STATE_CHANGED",
         r"state 'count' \(column family 'count'\) of {operator} was stored as \w+ state of "
         r"bigint and is now declared as \w+ state of string"),
        ("key type", "KEYED_FUNCTION_KEY_CHANGED",
         r"{operator} was keyed by \[k bigint\] on this checkpoint and is now keyed by "
         r"\[k string\]"),
    ],
)
def test_a_keyed_function_restarted_with_another_state_or_key_type_fails_naming_the_operator(
    spark: SparkSession, tmp_path: Path, change: str, error_id: str, says: str
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ck"

    def run(function: KeyedProcessFunction, key_type: str) -> None:
        spark.range(20).selectExpr("id % 5 as k", "id as v").write.mode("append").parquet(
            str(source)
        )
        rows = spark.readStream.schema("k long, v long").parquet(str(source))
        rows = rows.select(F.col("k").cast(key_type).alias("k"), "v")
        out = keyedstate.key_by(rows, "k").process(function, f"k {key_type}, n long")
        query = (
            out.writeStream.format("noop").outputMode("append")
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )
        query.awaitTermination(180)

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", keyedstate.PROVIDER_CLASS)
    run(Count(), "long")
    # Keyed functions are stateful operators 1000 + n (Spark numbers its own from 0).
    state_before = state_files(checkpoint / "state" / "1000")
    assert state_before
    with pytest.raises(StreamingQueryException) as failure:
        if change == "state type":
            run(Count(as_text=True), "long")
        else:
            run(Count(), "string")
    error = keyedstate.state_error(failure.value)
    assert isinstance(error, keyedstate.KeyedFunctionError), str(failure.value)[:2000]
    assert error.error_id == error_id
    message = str(error)
    operator = re.escape(
        "stateful operator 1000 (KeyedStateApplyExec / keyed function "
    ) + r"Count, state store 'default'\)"
    assert message.startswith(f"[{error_id}] "), message
    assert re.search(says.format(operator=operator), message), message
    assert state_files(checkpoint / "state" / "1000") == state_before
