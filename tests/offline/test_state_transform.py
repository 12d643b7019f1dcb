"""Transforming a savepoint (Flink's ``SavepointWriter.fromExistingSavepoint``): a state mapped,
a state dropped and a uid renamed; the query restored from the result goes on from the changed
state; Spark's operators cannot be dropped and a map must keep the table's columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import key_by
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.offline.test_savepoints import OUT, PHASES, Tally, counts, ran_first_phase, tally
from tests.support.streaming_harness import committed_batches


def renamed_tally(frame: DataFrame) -> DataFrame:
    return key_by(frame, "k").process(Tally(), OUT, uid="ledger")


def stored(spark: SparkSession, path: Path, operator: Any, state: str) -> dict[Any, Any]:  # noqa: ANN401
    frame = keyedstate.state.read(spark, str(path), operator, state).drop("partition_id")
    return {r[0]: r[-1] for r in frame.collect()}


def test_a_mapped_dropped_and_renamed_savepoint_restores_as_changed(
    spark: SparkSession, tmp_path: Path
) -> None:
    line, checkpoint = ran_first_phase(spark, tmp_path, tally, "append")
    source = tmp_path / "savepoint"
    keyedstate.savepoint(spark, str(checkpoint), str(source))
    before = stored(spark, source, "tally", "count")

    target = tmp_path / "changed"
    info = keyedstate.state.transform(
        spark,
        str(source),
        str(target),
        map_states={("tally", "count"): lambda rows: rows.withColumn("value", F.col("value") * 10)},
        drop=[("tally", "parity")],
        rename_uids={"tally": "ledger"},
    )
    assert info.format == "canonical" and info.batch_id == committed_batches(checkpoint)[-1]
    assert [(o.uid, sorted(t.state for t in o.tables)) for o in info.operators] == [
        ("ledger", ["count", "recent"])
    ]
    assert stored(spark, target, "ledger", "count") == {k: 10 * n for k, n in before.items()}
    with pytest.raises(keyedstate.QueryCheckpointError, match="no keyed function with uid 'tally'"):
        keyedstate.state.read(spark, str(target), "tally", "count")

    restored = tmp_path / "restored"
    keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=3)
    line.build = renamed_tally
    line.run(restored, PHASES[1])
    after = stored(spark, restored, "ledger", "count")
    want = {k: 10 * n for k, n in before.items()}
    for rows in PHASES[1]:
        for row in rows:
            want[row["k"]] = want.get(row["k"], 0) + 1
    assert after == want
    # The dropped map state started empty: it counts the new rows' odd values only.
    parity = keyedstate.state.read(spark, str(restored), "ledger", "parity").drop("partition_id")
    odd = sum(r["value"] for r in parity.collect() if r["user_map_key"] == "odd")
    assert odd == sum(row["v"] % 2 for rows in PHASES[1] for row in rows)


def test_spark_operators_are_not_dropped_and_a_map_keeps_the_columns(
    spark: SparkSession, tmp_path: Path
) -> None:
    _, checkpoint = ran_first_phase(spark, tmp_path, counts, "update")
    source = tmp_path / "savepoint"
    keyedstate.savepoint(spark, str(checkpoint), str(source))
    with pytest.raises(keyedstate.QueryCheckpointError, match="only keyed functions are renamed"):
        keyedstate.state.transform(spark, str(source), str(tmp_path / "t1"), drop=[0])
    with pytest.raises(keyedstate.QueryCheckpointError, match="the rows replacing store 'default'"):
        keyedstate.state.transform(
            spark,
            str(source),
            str(tmp_path / "t2"),
            map_states={(0, "default"): lambda rows: rows.select("partition_id", "key")},
        )
    assert not (tmp_path / "t1").exists() and not (tmp_path / "t2").exists()
    # Spark's store mapped (the aggregation buffer holds count and sum): every count doubled.
    doubled = keyedstate.state.transform(
        spark,
        str(source),
        str(tmp_path / "t3"),
        map_states={
            (0, "default"): lambda rows: rows.withColumn(
                "value", F.struct((F.col("value.count") * 2).alias("count"), F.col("value.sum"))
            )
        },
    )
    assert doubled.operators[0].tables[0].rows == 9
    read = keyedstate.state.read(spark, str(tmp_path / "t3"), 0).collect()
    rows = keyedstate.state.read(spark, str(source), 0).collect()
    original = {r["key"]["k"]: r["value"]["count"] for r in rows}
    assert {r["key"]["k"]: r["value"]["count"] for r in read} == {
        k: 2 * n for k, n in original.items()
    }


