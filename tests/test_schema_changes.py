"""A restart with an incompatible state schema fails before it touches the state, naming both."""

from __future__ import annotations

from pathlib import Path

import keyedstate
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F


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
    state_before = sorted(p.name for p in (checkpoint / "state" / "0" / "0").rglob("*"))
    with pytest.raises(StreamingQueryException) as failure:
        run(aggregate, key)
    message = str(failure.value)
    assert error in message and existing in message and new in message, (change, message)
    assert sorted(p.name for p in (checkpoint / "state" / "0" / "0").rglob("*")) == state_before
