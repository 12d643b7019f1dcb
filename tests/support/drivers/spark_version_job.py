"""Run by tests/versions/test_spark_versions.py with one Spark version's pyspark. Prints ``RESULT``
with the pyspark version, the jar keyedstate picked and what each step gave (JSON).

``python spark_version_job.py <workdir> write``: a keyed function with value state and Spark's
streaming aggregation on keyedstate's provider, each across a restart on its checkpoint (phases
0 and 1); the keyed function's state read back (``keyedstate.state.read``); the provider's
metrics of the last progress; a canonical savepoint of the aggregation restored into Spark's
HDFS-backed provider and continued there (phase 2), and restored into Spark's RocksDB provider;
Spark's ``transformWithStateInPandas`` on keyedstate's provider (refused on every version).

``python spark_version_job.py <workdir> continue``: both checkpoints the ``write`` run left,
continued (phase 2) by this Spark: a checkpoint written by one version is read by another.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyedstate
import pandas as pd
import pyspark
from keyedstate import KeyedProcessFunction, RuntimeContext, ValueStateDescriptor
from keyedstate.errors import state_error
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

# The input, one file per phase; the query restarts on its checkpoint between them.
PHASES = [[("a", 1), ("b", 2), ("a", 3)], [("a", 10), ("c", 1)], [("a", 100), ("b", 5)]]

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class RunningTotal(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.total = runtime_context.get_state(ValueStateDescriptor("total", int))

    def process_element(self, value: Any, ctx: Any) -> Iterator[tuple[str, int]]:  # noqa: ANN401
        total = (self.total.value() or 0) + value.n
        self.total.update(total)
        yield ctx.get_current_key(), total


def run_phase(
    frame: DataFrame, mode: str, checkpoint: Path, progress: list[Any] | None = None
) -> list[list[Any]]:
    rows: list[list[Any]] = []
    query = (
        frame.writeStream.outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda df, _: rows.extend(sorted(list(r) for r in df.collect())))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    failure = query.exception()
    if failure is not None:
        raise failure
    if progress is not None:
        progress.extend(query.recentProgress)
    return rows


def add_input(workdir: Path, phase: int) -> None:
    lines = "".join(json.dumps({"k": k, "n": n}) + "\n" for k, n in PHASES[phase])
    (workdir / "input").mkdir(exist_ok=True)
    (workdir / "input" / f"part-{phase}.json").write_text(lines)


def queries(spark: SparkSession, workdir: Path) -> tuple[DataFrame, DataFrame]:
    events = spark.readStream.schema("k string, n long").json(str(workdir / "input"))
    keyed = keyedstate.key_by(events, "k").process(RunningTotal(), "k string, total long")
    return keyed, events.groupBy("k").agg(F.sum("n").alias("total"))


def error_of(step: Any) -> str:  # noqa: ANN401 - a call
    """The error a step raised ("" when it ran), as keyedstate maps it: its class and first line."""
    try:
        step()
    except Exception as e:  # noqa: BLE001 - reported to the test, which checks it
        error = state_error(e) or e
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return ""


class SparkCounter(StatefulProcessor):
    """Spark's own per-key API (transformWithStateInPandas), refused on keyedstate's provider
    (also by tests/api/test_state_api_validation.py)."""

    def init(self, handle: Any) -> None:  # noqa: ANN401
        self.count = handle.getValueState("count", "c long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: ANN401, N802, N803
        yield pd.DataFrame({"k": [key[0]], "c": [sum(len(r) for r in rows)]})

    def close(self) -> None:
        pass


def transform_with_state(spark: SparkSession, workdir: Path) -> str:
    """Spark's own transformWithStateInPandas, asked to run on keyedstate's provider."""

    def start() -> None:
        events = spark.readStream.schema("k string, n long").json(str(workdir / "input"))
        frame = events.groupBy("k").transformWithStateInPandas(
            SparkCounter(), "k string, c long", "append", "None"
        )
        run_phase(frame, "append", workdir / "checkpoint-tws")

    return error_of(start)


def write(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"keyed": [], "aggregation": []}
    progress: list[Any] = []
    for phase in (0, 1):
        add_input(workdir, phase)
        keyed, totals = queries(spark, workdir)
        results["keyed"].append(run_phase(keyed, "append", workdir / "checkpoint-keyed"))
        results["aggregation"].append(
            run_phase(totals, "update", workdir / "checkpoint-agg", progress)
        )
    state = keyedstate.state.read(spark, str(workdir / "checkpoint-keyed"))
    results["read"] = sorted([r["k"], r["value"]] for r in state.collect())
    results["metrics"] = sorted(
        name
        for p in progress
        for op in p["stateOperators"]
        for name in op["customMetrics"]
        if name.startswith("keyedstate")
    )
    savepoint = workdir / "savepoint-agg"
    keyedstate.savepoint(spark, str(workdir / "checkpoint-agg"), str(savepoint), format="canonical")
    # Into Spark's HDFS-backed provider, continued there on phase 2.
    restored = workdir / "restored-hdfs"
    keyedstate.restore_savepoint(spark, str(savepoint), str(restored), provider=HDFS_PROVIDER)
    add_input(workdir, 2)
    _, totals = queries(spark, workdir)
    results["hdfs_restored"] = run_phase(totals, "update", restored)
    results["rocksdb_restore"] = error_of(
        lambda: keyedstate.restore_savepoint(
            spark, str(savepoint), str(workdir / "restored-rocksdb"), provider=ROCKSDB_PROVIDER
        )
    )
    results["rocksdb_restore_left"] = (workdir / "restored-rocksdb").exists()
    results["transform_with_state"] = transform_with_state(spark, workdir)
    return results


def continue_(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    keyed, totals = queries(spark, workdir)
    return {
        "keyed": run_phase(keyed, "append", workdir / "checkpoint-keyed"),
        "aggregation": run_phase(totals, "update", workdir / "checkpoint-agg"),
    }


def main(workdir: Path, step: str) -> None:
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    spark = keyedstate.configure(builder).getOrCreate()
    results = write(spark, workdir) if step == "write" else continue_(spark, workdir)
    spark.stop()
    summary = {"pyspark": pyspark.__version__, "jar": keyedstate.jar_path(), **results}
    print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
