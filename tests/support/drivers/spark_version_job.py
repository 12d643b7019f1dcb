"""Run by tests/versions/test_spark_versions.py with one Spark version's pyspark. Prints ``RESULT``
with the pyspark version, the jar keyedstate picked and what each step gave (JSON).

Six queries on keyedstate's provider, each with a checkpoint of its own, run one phase of input
at a time (``PHASES``; the query restarts between phases): a keyed function with value state, a
TTL and event-time timers (``TimedTotal``), and one query per stateful operator of Spark's that a
custom provider serves: a streaming aggregation, ``dropDuplicates``,
``dropDuplicatesWithinWatermark``, a stream-stream join, ``applyInPandasWithState`` and a session
window. The aggregation also goes through keyedstate's
exactly-once sinks: PostgreSQL (upserts into the table the work folder's ``sink-table`` names, on
the server the environment's ``SINK_POSTGRES`` gives: libpq keywords as JSON) and Kafka (into the
topic ``sink-topic`` names, on the broker ``SINK_KAFKA`` gives, with this Spark's Kafka connector,
whose jars ``SPARK_JOB_JARS`` lists).

``python spark_version_job.py crash <workdir>``: phase 0 of every query (its ``RESULT`` printed),
then phase 1 of the keyed function, which SIGKILLs its process group (driver and JVM) once its
first phase-1 batch has committed its state, before Spark commits the batch.

``python spark_version_job.py write <workdir>``: phase 1 of every query (the keyed function's
killed batch runs again); the Kafka topic read back by Spark's Kafka source; the keyed function's
state read back (``keyedstate.state.read``) and inspected; its
checkpoint rescaled in place from 2 to 3 partitions; the provider's metrics in the progress; a
canonical savepoint of the aggregation restored into Spark's HDFS-backed provider and continued
there (phase 2), and restored into Spark's RocksDB provider; Spark's
``transformWithStateInPandas`` on keyedstate's provider (refused on every version).

``python spark_version_job.py continue <workdir>...``: phase 2 of every query, on the checkpoints
the ``write`` runs left in each work folder, by this Spark: a checkpoint written by one version
is read by another.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keyedstate
import pandas as pd
import pyspark
from keyedstate import (
    KeyedProcessFunction,
    RuntimeContext,
    StateTtlConfig,
    Time,
    Types,
    ValueStateDescriptor,
    sinks,
)
from keyedstate.errors import state_error
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout

# The input, one file per phase: (key, n, event time in seconds).
PHASES = [
    [("a", 1, 10), ("b", 2, 20), ("a", 3, 30)],
    [("a", 10, 100), ("c", 1, 110)],
    [("a", 100, 200), ("b", 5, 210)],
]
SCHEMA = "k string, n long, t long"
# The keyed function's batch the crash step dies in: phase 1's first (phase 0 runs two, its data
# and the no-data batch that fires its timers).
KILLED_BATCH = 2

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class TimedTotal(KeyedProcessFunction):
    """A running total per key (value state); the key's last ``n``, kept 1 ms of processing time
    (a TTL: only a later element of the same micro-batch sees it); an event-time timer 1 s after
    each element, which emits the total once the watermark passes it. Rows: (key, "element" or
    "timer", time in ms, total, whether the TTL'd state was there)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.total = runtime_context.get_state(ValueStateDescriptor("total", Types.LONG()))
        last = ValueStateDescriptor("last", Types.LONG())
        last.enable_time_to_live(StateTtlConfig.new_builder(Time.milliseconds(1)).build())
        self.last = runtime_context.get_state(last)

    def process_element(self, value: Any, ctx: Any) -> Iterator[tuple[Any, ...]]:  # noqa: ANN401
        seen = self.last.value() is not None
        self.last.update(value.n)
        total = (self.total.value() or 0) + value.n
        self.total.update(total)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 1000)
        yield ctx.get_current_key(), "element", ctx.timestamp(), total, seen

    def on_timer(self, timestamp: int, ctx: Any) -> Iterator[tuple[Any, ...]]:  # noqa: ANN401
        seen = self.last.value() is not None
        yield ctx.get_current_key(), "timer", timestamp, self.total.value(), seen


def pandas_count(key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:  # noqa: ANN401
    """applyInPandasWithState: the number of elements per key so far."""
    count = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
    state.update((count,))
    yield pd.DataFrame({"k": [key[0]], "count": [count]})


def add_input(workdir: Path, phase: int) -> None:
    lines = "".join(json.dumps({"k": k, "n": n, "t": t}) + "\n" for k, n, t in PHASES[phase])
    (workdir / "input").mkdir(exist_ok=True)
    (workdir / "input" / f"part-{phase}.json").write_text(lines)


def events(spark: SparkSession, workdir: Path) -> DataFrame:
    frame = spark.readStream.schema(SCHEMA).json(str(workdir / "input"))
    return frame.withColumn("ts", F.timestamp_seconds("t"))


def aggregation(spark: SparkSession, workdir: Path) -> DataFrame:
    return events(spark, workdir).groupBy("k").agg(F.sum("n").alias("total"))


def queries(spark: SparkSession, workdir: Path) -> dict[str, tuple[DataFrame, str]]:
    """Each query by its checkpoint's name, with its output mode."""
    watermarked = events(spark, workdir).withWatermark("ts", "0 seconds")
    keyed = keyedstate.key_by(watermarked, "k", order_by="t").process(
        TimedTotal(), "k string, kind string, at long, total long, seen boolean"
    )
    right = events(spark, workdir).select("k", F.col("n").alias("m"))
    sessions = watermarked.groupBy(F.session_window("ts", "5 seconds"), "k").agg(F.sum("n"))
    pandas_state = (
        events(spark, workdir)
        .groupBy("k")
        .applyInPandasWithState(
            pandas_count,
            "k string, count long",
            "count long",
            "update",
            GroupStateTimeout.NoTimeout,
        )
    )
    return {
        "keyed": (keyed, "append"),
        "aggregation": (aggregation(spark, workdir), "update"),
        "dedup": (events(spark, workdir).dropDuplicates(["k"]).select("k"), "append"),
        # A key's state is kept until the watermark passes its first time + 4 s.
        "dedup_within_watermark": (
            events(spark, workdir)
            .withWatermark("ts", "4 seconds")
            .dropDuplicatesWithinWatermark(["k"])
            .select("k"),
            "append",
        ),
        "join": (events(spark, workdir).select("k", "n").join(right, "k"), "append"),
        "pandas_state": (pandas_state, "update"),
        "session": (
            sessions.select("k", F.col("session_window.start").cast("long"), "sum(n)"),
            "append",
        ),
    }


def start(
    frame: DataFrame,
    mode: str,
    checkpoint: Path,
    batches: list[list[Any]],
    after_batch: Callable[[int], None] | None = None,
) -> Any:  # noqa: ANN401 - a StreamingQuery
    """Starts ``frame`` (each micro-batch's rows go to ``batches``, sorted)."""

    def sink(df: DataFrame, batch_id: int) -> None:
        batches.append(sorted(list(r) for r in df.collect()))
        if after_batch is not None:
            after_batch(batch_id)

    return started(frame.writeStream.outputMode(mode).foreachBatch(sink), checkpoint)


def started(writer: Any, checkpoint: Path) -> Any:  # noqa: ANN401 - a DataStreamWriter, a query
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


def into_postgres(spark: SparkSession, workdir: Path) -> Any:  # noqa: ANN401 - a StreamingQuery
    """The aggregation upserted into PostgreSQL, exactly once per batch."""
    sink = sinks.postgres(
        (workdir / "sink-table").read_text().strip(),
        mode="upsert",
        key_columns=["k"],
        **json.loads(os.environ["SINK_POSTGRES"]),
    )
    writer = aggregation(spark, workdir).writeStream.outputMode("update").foreachBatch(sink)
    return started(writer, workdir / "checkpoint-postgres")


def into_kafka(spark: SparkSession, workdir: Path) -> Any:  # noqa: ANN401 - a StreamingQuery
    """The aggregation's updates written to Kafka, exactly once per batch (transactions)."""
    sink = sinks.kafka((workdir / "sink-topic").read_text().strip(), os.environ["SINK_KAFKA"])
    updates = aggregation(spark, workdir).select(
        F.col("k").alias("key"), F.col("total").cast("string").alias("value")
    )
    return started(
        updates.writeStream.outputMode("update").foreachBatch(sink), workdir / "checkpoint-kafka"
    )


def run_phase(
    spark: SparkSession, workdir: Path, progress: list[Any] | None = None
) -> dict[str, list[list[Any]]]:
    """One phase of every query, side by side: each query's micro-batches' rows (batches without
    rows left out)."""
    batches: dict[str, list[list[Any]]] = {}
    running = []
    for name, (frame, mode) in queries(spark, workdir).items():
        batches[name] = []
        running.append(start(frame, mode, workdir / f"checkpoint-{name}", batches[name]))
    running.append(into_postgres(spark, workdir))
    running.append(into_kafka(spark, workdir))
    for query in running:
        query.awaitTermination()
        if query.exception() is not None:
            raise query.exception()
        if progress is not None:
            progress.extend(query.recentProgress)
    return {name: [rows for rows in found if rows] for name, found in batches.items()}


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

    def run() -> None:
        frame = (
            events(spark, workdir)
            .groupBy("k")
            .transformWithStateInPandas(SparkCounter(), "k string, c long", "append", "None")
        )
        start(frame, "append", workdir / "checkpoint-tws", []).awaitTermination()

    return error_of(run)


def crash(spark: SparkSession, workdir: Path) -> None:
    add_input(workdir, 0)
    print("RESULT " + json.dumps(summary(run_phase(spark, workdir))), flush=True)
    add_input(workdir, 1)

    if os.getpgid(0) != os.getpid():
        raise AssertionError("the crash step kills its process group: start it in a new session")

    def die_after_state_commit(batch_id: int) -> None:
        if batch_id == KILLED_BATCH:  # the state of this batch is committed, the batch is not
            checkpoint = workdir / "checkpoint-keyed"
            killed_at = {
                "state_versions": sorted(
                    p.parent.name for p in checkpoint.glob(f"state/*/*/{KILLED_BATCH + 1}.manifest")
                ),
                "batch_committed": (checkpoint / "commits" / str(KILLED_BATCH)).exists(),
            }
            print("KILLED " + json.dumps(killed_at), flush=True)
            os.killpg(0, signal.SIGKILL)

    keyed, mode = queries(spark, workdir)["keyed"]
    start(keyed, mode, workdir / "checkpoint-keyed", [], die_after_state_commit).awaitTermination()
    raise AssertionError(f"batch {KILLED_BATCH} of the keyed function did not run")


def write(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    progress: list[Any] = []
    results: dict[str, Any] = run_phase(spark, workdir, progress=progress)
    # The Kafka sink's topic read back by Spark's own Kafka source (this Spark's connector).
    topic = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", os.environ["SINK_KAFKA"])
        .option("subscribe", (workdir / "sink-topic").read_text().strip())
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    results["kafka_read"] = sorted(
        [r.key.decode(), int(r.value.decode())] for r in topic.select("key", "value").collect()
    )
    keyed_checkpoint = str(workdir / "checkpoint-keyed")
    state = keyedstate.state.read(spark, keyed_checkpoint, state="total")
    results["read"] = sorted([r["k"], r["value"]] for r in state.collect())
    report = keyedstate.inspect(spark, keyed_checkpoint)
    results["inspected"] = {
        "partitions": report.partitions,
        "functions": [o.function for o in report.operators],
        "keys": sum(o.keys for o in report.operators),
    }
    rescaled = keyedstate.rescale(spark, keyed_checkpoint, 3, in_place=True)
    results["rescaled"] = [rescaled.from_partitions, rescaled.to_partitions]
    results["metrics"] = sorted(
        {
            name
            for p in progress
            for op in p["stateOperators"]
            for name in op["customMetrics"]
            if name.startswith("keyedstate")
        }
    )
    savepoint = workdir / "savepoint-aggregation"
    keyedstate.savepoint(
        spark, str(workdir / "checkpoint-aggregation"), str(savepoint), format="canonical"
    )
    # Into Spark's HDFS-backed provider, continued there on phase 2.
    restored = workdir / "restored-hdfs"
    keyedstate.restore_savepoint(spark, str(savepoint), str(restored), provider=HDFS_PROVIDER)
    add_input(workdir, 2)
    totals: list[list[Any]] = []
    start(aggregation(spark, workdir), "update", restored, totals).awaitTermination()
    results["hdfs_restored"] = [rows for rows in totals if rows]
    results["rocksdb_restore"] = error_of(
        lambda: keyedstate.restore_savepoint(
            spark, str(savepoint), str(workdir / "restored-rocksdb"), provider=ROCKSDB_PROVIDER
        )
    )
    results["rocksdb_restore_left"] = (workdir / "restored-rocksdb").exists()
    results["transform_with_state"] = transform_with_state(spark, workdir)
    return results


def summary(results: dict[str, Any]) -> dict[str, Any]:
    return {"pyspark": pyspark.__version__, "jar": keyedstate.jar_path(), **results}


def main(step: str, workdirs: list[Path]) -> None:
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", os.environ.get("SPARK_JOB_JARS", ""))
    )
    spark = keyedstate.configure(builder).getOrCreate()
    if step == "crash":
        crash(spark, workdirs[0])
    if step == "write":
        results = write(spark, workdirs[0])
    else:  # continue
        results = {"runs": {str(w): run_phase(spark, w) for w in workdirs}}
    spark.stop()
    print("RESULT " + json.dumps(summary(results)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [Path(p) for p in sys.argv[2:]])
