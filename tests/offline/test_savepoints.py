"""Savepoints, native and canonical: taken of a stopped or a running query (or when stopping it),
restored into a new checkpoint at the same or another partition count (a canonical one also
into Spark's RocksDB provider), the query resumes exactly after the savepoint's batch (its
output equals an uninterrupted run's); damaged or missing files are named; an unfinished
savepoint is never taken for one; list and dispose."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import (
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RuntimeContext,
    StateTtlConfig,
    Time,
    Types,
    ValueStateDescriptor,
    key_by,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.api.test_state_api_states import Average, Sum
from tests.support.state_api_support import ship_by_value
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    committed_batches,
    start_query,
)

SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.LongType())])
OUT = "k string, n long, recent long, odd long"


class Tally(KeyedProcessFunction):
    """Value, list and map state per key: a count, the last three values, the odd values' count."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.recent = runtime_context.get_list_state(ListStateDescriptor("recent", Types.LONG()))
        self.parity = runtime_context.get_map_state(
            MapStateDescriptor("parity", Types.STRING(), Types.LONG())
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        recent = ([*self.recent.get(), value.v])[-3:]
        self.recent.update(recent)
        side = "odd" if value.v % 2 else "even"
        self.parity.put(side, (self.parity.get(side) or 0) + 1)
        yield (value.k, n, sum(recent), self.parity.get("odd") or 0)


ship_by_value(__name__)

PHASES = [
    [[{"k": f"k{(i * 7 + b) % 9}", "v": i + 10 * b} for i in range(12)] for b in range(3)],
    [[{"k": f"k{(i * 5 + b) % 11}", "v": i * 3 + b} for i in range(10)] for b in range(3)],
]


def tally(frame: DataFrame) -> DataFrame:
    return key_by(frame, "k").process(Tally(), OUT, uid="tally")


def counts(frame: DataFrame) -> DataFrame:
    return frame.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("total"))


def pairs(frame: DataFrame) -> DataFrame:
    """A stream-stream join (of the stream with itself): four state stores per operator."""
    left = frame.select("k", F.col("v").alias("left"))
    return left.join(frame.select("k", F.col("v").alias("right")), "k")


Build = Callable[[DataFrame], DataFrame]


class Line:
    """A query over its own input directory (one file per micro-batch), run phase by phase."""

    def __init__(
        self,
        spark: SparkSession,
        root: Path,
        build: Build,
        mode: str,
        provider: str = PROVIDER_UNDER_TEST,
    ) -> None:
        self.spark, self.build, self.mode, self.provider = spark, build, mode, provider
        self.source = FileInput(root / "input", SCHEMA)
        self.collector = BatchCollector()

    def run(self, checkpoint: Path, phase: list[list[dict[str, Any]]]) -> None:
        self.source.add_all(phase)
        frame = self.build(self.source.read_stream(self.spark))
        query = start_query(self.spark, self.provider, frame, self.mode, checkpoint, self.collector)
        await_finished(query)


def stored_rows(spark: SparkSession, location: Path, operator: int, state: str) -> list[str]:
    """A table's rows wherever they are stored (``partition_id`` aside), comparable."""
    frame = keyedstate.state.read(spark, str(location), operator, state).drop("partition_id")
    return sorted(json.dumps(r.asDict(recursive=True), sort_keys=True) for r in frame.collect())


def normalized(batches: dict[int, list[dict[str, Any]]], after: int) -> dict[int, list[str]]:
    return {
        b: sorted(json.dumps(r, sort_keys=True) for r in rows)
        for b, rows in batches.items()
        if b > after
    }


def ran_first_phase(
    spark: SparkSession,
    tmp_path: Path,
    build: Build,
    mode: str,
    provider: str = PROVIDER_UNDER_TEST,
    phase: list[list[dict[str, Any]]] | None = None,
) -> tuple[Line, Path]:
    """A line at ``tmp_path / "line"`` that ran ``phase`` (the first of PHASES): (the line, its
    checkpoint)."""
    line = Line(spark, tmp_path / "line", build, mode, provider)
    checkpoint = tmp_path / "line" / "checkpoint"
    line.run(checkpoint, PHASES[0] if phase is None else phase)
    return line, checkpoint


def reference_and_saved(
    spark: SparkSession,
    tmp_path: Path,
    build: Build,
    mode: str,
    phases: list[list[list[dict[str, Any]]]],
    fmt: str,
    target: Path | None = None,
) -> tuple[Line, Line, int, Path, Any]:
    """An uninterrupted run of every phase, and a line that ran the first phase and was saved
    (``fmt``) at ``target`` (``tmp_path / "savepoint"``): (reference, line, batch saved, target,
    info)."""
    reference = Line(spark, tmp_path / "reference", build, mode)
    for phase in phases:
        reference.run(tmp_path / "reference" / "checkpoint", phase)
    line, original = ran_first_phase(spark, tmp_path, build, mode, phase=phases[0])
    batch = committed_batches(original)[-1]
    target = tmp_path / "savepoint" if target is None else target
    info = keyedstate.savepoint(spark, str(original), str(target), format=fmt)
    return reference, line, batch, target, info


SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SPARK_HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


@pytest.mark.parametrize(
    ("build", "mode", "partitions", "fmt", "provider"),
    [
        (tally, "append", None, "native", None),
        (counts, "update", None, "native", None),
        (counts, "update", 3, "native", None),
        (tally, "append", 1, "native", None),
        (tally, "append", None, "canonical", None),
        (tally, "append", 3, "canonical", None),
        (counts, "update", 1, "canonical", None),
        (counts, "update", 3, "canonical", SPARK_ROCKSDB),
        (counts, "update", 3, "canonical", SPARK_HDFS),
        (pairs, "append", 3, "canonical", None),
    ],
    ids=[
        "keyed-function",
        "aggregation",
        "aggregation-to-3",
        "keyed-function-to-1",
        "canonical-keyed-function",
        "canonical-keyed-function-to-3",
        "canonical-aggregation-to-1",
        "canonical-aggregation-into-spark-rocksdb-at-3",
        "canonical-aggregation-into-spark-hdfs-at-3",
        "canonical-join-to-3",
    ],
)
def test_a_restored_savepoint_continues_as_the_uninterrupted_query(
    spark: SparkSession,
    tmp_path: Path,
    build: Build,
    mode: str,
    partitions: int | None,
    fmt: str,
    provider: str | None,
) -> None:
    restores_and_continues(spark, tmp_path, build, mode, partitions, fmt, provider)


FORMAT_VERSION = "spark.sql.streaming.stateStore.checkpointFormatVersion"


@contextlib.contextmanager
def checkpoint_format(spark: SparkSession, version: int) -> Iterator[None]:
    """Queries started inside run with checkpoint format ``version``."""
    previous = spark.conf.get(FORMAT_VERSION)
    spark.conf.set(FORMAT_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.set(FORMAT_VERSION, previous)


def commit_ids(checkpoint: Path, batch: int) -> Any:  # noqa: ANN401 - JSON
    return json.loads((checkpoint / "commits" / str(batch)).read_text().splitlines()[1]).get(
        "stateUniqueIds"
    )


@pytest.mark.parametrize(
    ("build", "mode", "partitions", "fmt"),
    [
        (tally, "append", None, "native"),
        (tally, "append", 3, "native"),
        (counts, "update", 3, "canonical"),
        (tally, "append", 1, "canonical"),
    ],
    ids=["keyed-function", "keyed-function-to-3", "canonical-aggregation-to-3",
         "canonical-keyed-function-to-1"],
)
def test_a_format_v2_query_restores_at_any_count_in_either_format(
    spark: SparkSession, tmp_path: Path, build: Build, mode: str, partitions: int | None, fmt: str
) -> None:
    """Under checkpoint format v2 (a commit records an id per store version) a savepoint keeps
    its versions by version alone and its commits without ids: it restores at any count, and the
    restored query, still on format v2, records ids again from its next commit."""
    with checkpoint_format(spark, 2):
        batch, restored = restores_and_continues(
            spark, tmp_path, build, mode, partitions, fmt, None
        )
    assert commit_ids(tmp_path / "reference" / "checkpoint", batch), "the query ran on format v1"
    assert commit_ids(restored, batch) is None
    assert commit_ids(restored, committed_batches(restored)[-1])


def restores_and_continues(
    spark: SparkSession,
    tmp_path: Path,
    build: Build,
    mode: str,
    partitions: int | None,
    fmt: str,
    provider: str | None,
) -> tuple[int, Path]:
    """Saves a line after its first phase, restores it (at ``partitions``, into ``provider``)
    and runs the second phase on the restored checkpoint: its output after the saved batch
    equals an uninterrupted run's. (the saved batch, the restored checkpoint)"""
    reference, line, batch, target, info = reference_and_saved(
        spark, tmp_path, build, mode, PHASES, fmt, tmp_path / "savepoints" / "sp-1"
    )
    original = tmp_path / "line" / "checkpoint"  # the saved line's (ran_first_phase)
    assert (info.format, info.batch_id, info.state_version, info.partitions) == (
        fmt,
        batch,
        batch + 1,
        2,
    )
    assert (target / "_savepoint.json").exists() and info.files > 0 and info.bytes > 0
    if build is tally:
        assert [(o.operator_id, o.name, o.function, o.uid) for o in info.operators] == [
            (1000, "keyedProcess", "Tally", "tally")
        ]

        # The state processor's reader reads a savepoint as it reads a checkpoint.
        def stored(location: Path) -> list[Any]:
            frame = keyedstate.state.read(spark, str(location), "tally", "recent")
            return sorted(tuple(r) for r in frame.collect())

        assert stored(target) == stored(original) and stored(target)
    # The savepoint is self-contained: the original checkpoint can go.
    shutil.rmtree(original)
    restored = tmp_path / "restored"
    result = keyedstate.restore_savepoint(
        spark, str(target), str(restored), partitions=partitions, provider=provider
    )
    assert (result.batch_id, result.to_partitions) == (batch, partitions or 2)
    pinned = json.loads((restored / "offsets" / str(batch)).read_text().splitlines()[1])["conf"]
    assert pinned["spark.sql.streaming.stateStore.providerClass"] == (
        provider or PROVIDER_UNDER_TEST
    )
    # Every table the savepoint holds is in the restored checkpoint, row for row.
    for op in info.operators:
        for table in op.tables:
            assert table.rows > 0
            assert stored_rows(spark, restored, op.operator_id, table.state) == stored_rows(
                spark, target, op.operator_id, table.state
            ), (op.operator_id, table.state)
    # Spark's operator metadata names the restored checkpoint's folders, not the source's.
    operator_metadata = list(restored.glob("state/*/_metadata/v2/[0-9]*"))
    assert operator_metadata or build is not tally
    for metadata in operator_metadata:
        info_json = json.loads(metadata.read_text().splitlines()[1])
        for store in info_json["stateStoreInfo"]:
            for path in store["stateSchemaFilePaths"]:
                assert path.startswith(f"file:{restored}/state/"), (metadata, path)
    line.run(restored, PHASES[1])
    # Resumed exactly after the savepoint's batch: none replayed, none skipped.
    got, want = (
        normalized(line.collector.batches, batch),
        normalized(reference.collector.batches, batch),
    )
    assert got == want
    return batch, restored


def test_a_canonical_savepoint_moves_spark_rocksdb_state_into_keyedstate(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark's RocksDB provider's state leaves through a canonical savepoint and continues on
    keyedstate's provider at another partition count, as the uninterrupted query would."""
    reference = Line(spark, tmp_path / "reference", counts, "update", SPARK_ROCKSDB)
    for phase in PHASES:
        reference.run(tmp_path / "reference" / "checkpoint", phase)
    line, original = ran_first_phase(spark, tmp_path, counts, "update", SPARK_ROCKSDB)
    batch = committed_batches(original)[-1]
    target = tmp_path / "sp"
    info = keyedstate.savepoint(spark, str(original), str(target), format="canonical")
    assert (info.provider, [t.rows for o in info.operators for t in o.tables]) == (
        SPARK_ROCKSDB,
        [9],
    )
    restored = tmp_path / "restored"
    keyedstate.restore_savepoint(
        spark, str(target), str(restored), partitions=3, provider=PROVIDER_UNDER_TEST
    )
    assert stored_rows(spark, restored, 0, "default") == stored_rows(spark, original, 0, "default")
    line.run(restored, PHASES[1])
    got, want = (
        normalized(line.collector.batches, batch),
        normalized(reference.collector.batches, batch),
    )
    assert got == want


def test_a_savepoint_of_a_running_query_restores_to_the_same_output(
    spark: SparkSession, tmp_path: Path
) -> None:
    reference = Line(spark, tmp_path / "reference", tally, "append")
    for phase in PHASES:
        reference.run(tmp_path / "reference" / "checkpoint", phase)

    source = FileInput(tmp_path / "running" / "input", SCHEMA)
    source.add_all(PHASES[0])
    checkpoint = tmp_path / "running" / "checkpoint"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_UNDER_TEST)
    collector = BatchCollector()
    query = (
        tally(source.read_stream(spark))
        .writeStream.outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(collector)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while len(committed_batches(checkpoint)) < len(PHASES[0]):
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.05)
        target = tmp_path / "savepoint"
        info = keyedstate.savepoint(spark, str(checkpoint), str(target))
        assert query.isActive  # taken beside the running query
        source.add_all(PHASES[1])  # the running query goes on; the savepoint has none of it
        while len(committed_batches(checkpoint)) < len(PHASES[0]) + len(PHASES[1]):
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.05)
    finally:
        query.stop()
    assert info.batch_id == len(PHASES[0]) - 1
    restored = Line(spark, tmp_path / "restored", tally, "append")
    restored.source = source  # the same input directory, as a restored query would read
    keyedstate.restore_savepoint(spark, str(target), str(tmp_path / "restored" / "checkpoint"))
    restored.run(tmp_path / "restored" / "checkpoint", [])
    after = info.batch_id
    assert normalized(restored.collector.batches, after) == normalized(
        reference.collector.batches, after
    )
    assert normalized(restored.collector.batches, after) == normalized(collector.batches, after)


def test_stop_with_savepoint_list_and_dispose(spark: SparkSession, tmp_path: Path) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add_all(PHASES[0])
    checkpoint = tmp_path / "checkpoint"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_UNDER_TEST)
    query = (
        counts(source.read_stream(spark))
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .format("noop")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    deadline = time.monotonic() + 120
    while len(committed_batches(checkpoint)) < len(PHASES[0]):
        assert query.isActive and time.monotonic() < deadline, query.exception()
        time.sleep(0.05)
    directory = tmp_path / "savepoints"
    info = keyedstate.stop_with_savepoint(query, str(directory / "final"))
    assert not query.isActive
    assert info.batch_id == committed_batches(checkpoint)[-1]
    second = keyedstate.savepoint(spark, str(checkpoint), str(directory / "again"))
    listed = keyedstate.list_savepoints(spark, str(directory))
    assert [s.batch_id for s in listed] == [info.batch_id, second.batch_id]
    assert [Path(s.path).name for s in listed] == ["final", "again"]
    checked = keyedstate.inspect_savepoint(spark, str(directory / "final"), verify=True)
    assert checked.files == info.files and checked.bytes == info.bytes
    (directory / "final" / "notes.txt").write_text("the user's own file")
    keyedstate.dispose_savepoint(spark, str(directory / "final"))
    # Only what the savepoint owned is gone.
    assert [p.name for p in (directory / "final").iterdir()] == ["notes.txt"]
    assert [Path(s.path).name for s in keyedstate.list_savepoints(spark, str(directory))] == [
        "again"
    ]


def test_damaged_missing_and_unfinished_savepoints(spark: SparkSession, tmp_path: Path) -> None:
    line, checkpoint = ran_first_phase(spark, tmp_path, counts, "update")
    target = tmp_path / "savepoint"
    keyedstate.savepoint(spark, str(checkpoint), str(target))

    # Neither the checkpoint itself nor a folder inside it, nor a checkpoint, is a target.
    for wrong in (checkpoint, checkpoint / "state" / "savepoint"):
        with pytest.raises(keyedstate.QueryCheckpointError, match="overlap"):
            keyedstate.savepoint(spark, str(checkpoint), str(wrong))
    other = tmp_path / "other"
    other.mkdir()
    (other / "metadata").write_text("{}")
    with pytest.raises(
        keyedstate.QueryCheckpointError, match="is not empty and holds no savepoint"
    ):
        keyedstate.savepoint(spark, str(checkpoint), str(other))
    assert (other / "metadata").exists()
    # No query runs on a savepoint: restore it first.
    line.source.add(PHASES[1][0])
    frame = line.build(line.source.read_stream(spark))
    query = start_query(spark, PROVIDER_UNDER_TEST, frame, "update", target, BatchCollector())
    with pytest.raises(Exception, match="is part of a savepoint"):  # noqa: PT011 - a query's failure
        await_finished(query)

    # A savepoint that died before its metadata (its pending marker stays) is no savepoint, and
    # taking it again succeeds.
    (target / "_savepoint.json").unlink()
    (target / ".keyedstate-savepoint-pending").write_text("killed")
    with pytest.raises(
        keyedstate.CheckpointError, match=r"No savepoint at .*_savepoint\.json does"
    ):
        keyedstate.restore_savepoint(spark, str(target), str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()
    info = keyedstate.savepoint(spark, str(checkpoint), str(target))
    with pytest.raises(keyedstate.QueryCheckpointError, match="already holds a savepoint"):
        keyedstate.savepoint(spark, str(checkpoint), str(target))

    # A damaged log file and a missing state file are named, and the restore leaves nothing.
    offsets = target / "offsets" / str(info.batch_id)
    original = offsets.read_bytes()
    offsets.write_bytes(original.replace(b"{", b"[", 1))
    with pytest.raises(keyedstate.CheckpointError, match=rf"Savepoint file .*{offsets} is damaged"):
        keyedstate.restore_savepoint(spark, str(target), str(tmp_path / "r1"))
    assert not (tmp_path / "r1").exists()
    offsets.write_bytes(original)
    sst = sorted(
        p
        for p in (target / "state" / "0" / "1").rglob("*")
        if p.parent.name in ("shared", "changelog") and not p.name.startswith(".")
    )[0]
    sst.unlink()
    with pytest.raises(
        keyedstate.CheckpointError, match=rf"Savepoint file .*{sst.name} is missing"
    ):
        keyedstate.restore_savepoint(spark, str(target), str(tmp_path / "r2"))
    assert not (tmp_path / "r2").exists()
    with pytest.raises(keyedstate.CheckpointError, match=rf"{sst.name} is missing"):
        keyedstate.inspect_savepoint(spark, str(target), verify=True)
    with pytest.raises(keyedstate.QueryCheckpointError, match="is not empty"):
        keyedstate.restore_savepoint(spark, str(target), str(checkpoint))


def test_a_restore_killed_mid_way_starts_no_query_and_is_redone(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A restore killed mid-way leaves its unfinished marker in the new checkpoint (written
    first, removed last): a query refuses to start there, naming it, and the next restore into
    the same folder replaces it."""
    reference, line, batch, target, _ = reference_and_saved(
        spark, tmp_path, tally, "append", PHASES, "native"
    )
    restored = tmp_path / "restored"
    keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=3)
    marker = restored / ".keyedstate-restore-unfinished"
    assert not marker.exists()
    # As the restore is when killed: the marker still there, a partition's state not written yet.
    marker.write_text(f"{target}\n")
    for manifest in (restored / "state" / "1000" / "2").glob("*.manifest"):
        manifest.unlink()
    with pytest.raises(Exception, match="holds an unfinished restore"):  # noqa: PT011 - a query's failure
        line.run(restored, PHASES[1])
    with pytest.raises(keyedstate.QueryCheckpointError, match="is not empty"):
        keyedstate.restore_savepoint(spark, str(target), str(tmp_path / "line" / "checkpoint"))
    keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=3)
    assert not marker.exists()
    line.collector.clear()
    line.run(restored, [])  # the second phase's files are in the input already
    assert normalized(line.collector.batches, batch) == normalized(
        reference.collector.batches, batch
    )


def test_a_damaged_or_missing_canonical_table_file_is_named(
    spark: SparkSession, tmp_path: Path
) -> None:
    _, checkpoint = ran_first_phase(spark, tmp_path, tally, "append")
    target = tmp_path / "savepoint"
    keyedstate.savepoint(spark, str(checkpoint), str(target), format="canonical")
    parquet = sorted((target / "tables").rglob("*.parquet"))
    assert parquet, "the canonical savepoint wrote no table"
    truncated, missing = parquet[0], parquet[-1]
    original = truncated.read_bytes()
    truncated.write_bytes(original[: len(original) // 2])
    with pytest.raises(keyedstate.CheckpointError, match=rf"Savepoint file .*{truncated.name} is"):
        keyedstate.restore_savepoint(spark, str(target), str(tmp_path / "r1"))
    assert not (tmp_path / "r1").exists()
    truncated.write_bytes(original)
    missing.unlink()
    with pytest.raises(keyedstate.CheckpointError, match=rf"{missing.name} is missing"):
        keyedstate.restore_savepoint(spark, str(target), str(tmp_path / "r2"))
    assert not (tmp_path / "r2").exists()


class Timed(KeyedProcessFunction):
    """Reducing and aggregating state, and an event-time timer 3 s after each element that
    reports them when the watermark passes it."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.total = runtime_context.get_reducing_state(
            ReducingStateDescriptor("total", Sum(), Types.LONG())
        )
        self.mean = runtime_context.get_aggregating_state(
            AggregatingStateDescriptor("mean", Average(), Types.TUPLE([Types.LONG(), Types.LONG()]))
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        self.total.add(value.v)
        self.mean.add(value.v)
        ctx.timer_service().register_event_time_timer(value.v * 1000 + 3000)
        yield (value.k, "element", value.v * 1000, self.total.get(), self.mean.get())

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:  # noqa: ANN401
        yield (ctx.get_current_key(), "timer", timestamp, self.total.get(), self.mean.get())


TIMED_OUT = "k string, kind string, at long, total long, mean double"
# Event times (v, in seconds) rise from batch to batch: each batch's watermark fires timers.
TIMED_PHASES = [
    [[{"k": f"k{i % 5}", "v": 10 * b + i} for i in range(8)] for b in range(3)],
    [[{"k": f"k{i % 4}", "v": 10 * b + i} for i in range(8)] for b in range(3, 6)],
]


def timed(frame: DataFrame) -> DataFrame:
    events = frame.withColumn("ts", F.timestamp_seconds("v")).withWatermark("ts", "2 seconds")
    return key_by(events, "k").process(Timed(), TIMED_OUT, uid="timed")


@pytest.mark.parametrize(
    ("fmt", "partitions"), [("native", 3), ("canonical", None), ("canonical", 3)]
)
def test_reducing_and_aggregating_state_and_timers_continue_through_a_savepoint(
    spark: SparkSession, tmp_path: Path, fmt: str, partitions: int | None
) -> None:
    reference, line, batch, target, info = reference_and_saved(
        spark, tmp_path, timed, "append", TIMED_PHASES, fmt
    )
    if fmt == "canonical":
        tables = {t.state: t.rows for o in info.operators for t in o.tables}
        assert tables["total"] > 0 and tables["mean"] > 0 and tables["$eventTimers"] > 0, tables
    restored = tmp_path / "restored"
    keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=partitions)
    line.run(restored, TIMED_PHASES[1])
    fired = [r for rows in line.collector.batches.values() for r in rows if r["kind"] == "timer"]
    assert fired, "no timer fired after the restore"
    want = normalized(reference.collector.batches, batch)
    assert normalized(line.collector.batches, batch) == want


TTL_MS = 10_000


class Expiring(KeyedProcessFunction):
    """Value, list and map state with a 10 s TTL: a non-negative ``v`` is written to each, -1
    reads them (the view of what is still live)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        ttl = StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).build()
        last = ValueStateDescriptor("last", Types.LONG())
        seen = ListStateDescriptor("seen", Types.LONG())
        by = MapStateDescriptor("by", Types.STRING(), Types.LONG())
        for descriptor in (last, seen, by):
            descriptor.enable_time_to_live(ttl)
        self.last = runtime_context.get_state(last)
        self.seen = runtime_context.get_list_state(seen)
        self.by = runtime_context.get_map_state(by)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        now = ctx.timer_service().current_processing_time()
        if value.v >= 0:
            self.last.update(value.v)
            self.seen.add(value.v)
            self.by.put(f"e{value.v}", value.v)
            yield (value.k, now, "null")
        else:
            view = {
                "last": self.last.value(),
                "seen": self.seen.get(),
                "by": sorted(self.by.items()),
            }
            yield (value.k, now, json.dumps(view, sort_keys=True))


def expiring(frame: DataFrame) -> DataFrame:
    return key_by(frame, "k").process(Expiring(), "k string, now long, view string", uid="expiring")


class ExpiringModel:
    """Flink's TTL on plain values (expired when last access + TTL <= now), with each value's
    last access."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[int, int]] = {}
        self.seen: dict[str, list[tuple[int, int]]] = {}
        self.by: dict[str, dict[str, tuple[int, int]]] = {}

    def write(self, k: str, v: int, now: int) -> None:
        self.last[k] = (v, now)
        self.seen.setdefault(k, []).append((v, now))
        self.by.setdefault(k, {})[f"e{v}"] = (v, now)

    @staticmethod
    def live(stamp: int, now: int) -> bool:
        return stamp + TTL_MS > now

    def view(self, k: str, now: int) -> str:
        last = self.last.get(k)
        view = {
            "last": last[0] if last and self.live(last[1], now) else None,
            "seen": [v for v, t in self.seen.get(k, []) if self.live(t, now)],
            "by": sorted([m, v] for m, (v, t) in self.by.get(k, {}).items() if self.live(t, now)),
        }
        return json.dumps(view, sort_keys=True)

    def stored(self, now: int) -> dict[str, list[str]]:
        """The rows ``state.read`` gives at ``now`` (as ``stored_rows`` makes them comparable)."""
        stamp = "last_access_timestamp"
        rows: dict[str, list[dict[str, Any]]] = {
            "last": [{"k": k, "value": v, stamp: t} for k, (v, t) in self.last.items()],
            "seen": [{"k": k, "value": v, stamp: t} for k, vs in self.seen.items() for v, t in vs],
            "by": [
                {"k": k, "user_map_key": m, "value": v, stamp: t}
                for k, entries in self.by.items()
                for m, (v, t) in entries.items()
            ],
        }
        return {
            name: sorted(json.dumps(r, sort_keys=True) for r in rs if self.live(r[stamp], now))
            for name, rs in rows.items()
        }


@pytest.mark.parametrize(("fmt", "partitions"), [("native", 3), ("canonical", 3)])
def test_ttl_last_access_times_survive_a_savepoint(
    spark: SparkSession, tmp_path: Path, fmt: str, partitions: int
) -> None:
    """A savepoint keeps each TTL'd value's last access (a canonical one in its tables'
    ``last_access_timestamp``), so that the restored query expires state exactly as the
    original would have: a value written before the savepoint is gone TTL after its write,
    not TTL after the savepoint's batch."""
    line = Line(spark, tmp_path / "line", expiring, "append")
    original = tmp_path / "line" / "checkpoint"
    model = ExpiringModel()
    for rows in ([("a", 1), ("b", 2)], [("b", 3), ("c", 4)]):
        line.run(original, [[{"k": k, "v": v} for k, v in rows]])
        batch = committed_batches(original)[-1]
        now = line.collector.batches[batch][0]["now"]
        for k, v in rows:
            model.write(k, v, now)
    first, last = (line.collector.batches[b][0]["now"] for b in committed_batches(original))
    assert 0 < last - first < TTL_MS, "the two batches must be apart, and both live at the second"

    target = tmp_path / "savepoint"
    keyedstate.savepoint(spark, str(original), str(target), format=fmt)
    restored = tmp_path / "restored"
    keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=partitions)
    for name, want in model.stored(last).items():
        assert stored_rows(spark, target, "expiring", name) == want, (fmt, "savepoint", name)
        assert stored_rows(spark, restored, "expiring", name) == want, (fmt, "restored", name)

    # The restored query's next batch comes after the first write's TTL: 'a' has expired.
    time.sleep(max(0.0, (first + TTL_MS + 500) / 1000 - time.time()))
    line.run(restored, [[{"k": k, "v": -1} for k in ("a", "b", "c")]])
    batch = committed_batches(restored)[-1]
    got = sorted(line.collector.batches[batch], key=lambda r: r["k"])
    now = got[0]["now"]
    assert got == [{"k": k, "now": now, "view": model.view(k, now)} for k in ("a", "b", "c")]
    assert json.loads(got[0]["view"]) == {"last": None, "seen": [], "by": []}


COMPACT_INTERVAL = "spark.sql.streaming.fileSource.log.compactInterval"


@pytest.mark.parametrize(("fmt", "partitions"), [("native", None), ("canonical", 3)])
def test_a_file_sources_compacted_log_goes_through_a_savepoint(
    spark: SparkSession, tmp_path: Path, fmt: str, partitions: int | None
) -> None:
    """A file source compacts its log every few batches (``sources/0/<b>.compact`` holds every
    file read up to b): the savepoint carries the compacted log, and the restored query reads
    no file twice and skips none."""
    spark.conf.set(COMPACT_INTERVAL, "2")
    try:
        reference, line, batch, target, _ = reference_and_saved(
            spark, tmp_path, counts, "update", PHASES, fmt
        )
        log = sorted(p.name for p in (target / "sources" / "0").iterdir())
        assert "1.compact" in log, log
        restored = tmp_path / "restored"
        keyedstate.restore_savepoint(spark, str(target), str(restored), partitions=partitions)
        line.run(restored, PHASES[1])
        assert (restored / "sources" / "0" / "3.compact").exists()
    finally:
        spark.conf.unset(COMPACT_INTERVAL)
    assert normalized(line.collector.batches, batch) == normalized(
        reference.collector.batches, batch
    )
