"""Run by tests/versions/test_spark_versions.py with an older Spark version's pyspark: a keyed
function with value state and Spark's streaming aggregation on keyedstate's provider, each across
a restart on its checkpoint. Prints ``RESULT`` with the pyspark version, the jar keyedstate picked
and every batch's rows. Usage: ``python spark_version_job.py <workdir>``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyedstate
import pyspark
from keyedstate import KeyedProcessFunction, RuntimeContext, ValueStateDescriptor
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

# Two phases of input, one file each; the query restarts on its checkpoint between them.
PHASES = [[("a", 1), ("b", 2), ("a", 3)], [("a", 10), ("c", 1)]]


class RunningTotal(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.total = runtime_context.get_state(ValueStateDescriptor("total", int))

    def process_element(self, value: Any, ctx: Any) -> Iterator[tuple[str, int]]:  # noqa: ANN401
        total = (self.total.value() or 0) + value.n
        self.total.update(total)
        yield ctx.get_current_key(), total


def run_phase(frame: DataFrame, mode: str, checkpoint: Path) -> list[list[Any]]:
    rows: list[list[Any]] = []
    query = (
        frame.writeStream.outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda df, _: rows.extend(sorted(list(r) for r in df.collect())))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return rows


def main(workdir: Path) -> None:
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    spark = keyedstate.configure(builder).getOrCreate()
    (workdir / "input").mkdir()
    results: dict[str, list[list[list[Any]]]] = {"keyed": [], "aggregation": []}
    for phase, rows in enumerate(PHASES):
        lines = "".join(json.dumps({"k": k, "n": n}) + "\n" for k, n in rows)
        (workdir / "input" / f"part-{phase}.json").write_text(lines)
        events = spark.readStream.schema("k string, n long").json(str(workdir / "input"))
        keyed = keyedstate.key_by(events, "k").process(RunningTotal(), "k string, total long")
        totals = events.groupBy("k").agg(F.sum("n").alias("total"))
        results["keyed"].append(run_phase(keyed, "append", workdir / "checkpoint-keyed"))
        results["aggregation"].append(run_phase(totals, "update", workdir / "checkpoint-agg"))
    spark.stop()
    summary = {"pyspark": pyspark.__version__, "jar": keyedstate.jar_path(), **results}
    print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
