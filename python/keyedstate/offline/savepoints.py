"""Savepoints (docs/savepoints.md): take one of a running or stopped query, stop a query with
one, restore one into a new checkpoint, inspect, list and dispose of them."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from pyspark.sql import SparkSession

from keyedstate.offline._bridge import decode, operation, snake
from keyedstate.spark_connect import is_connect


@dataclass(frozen=True)
class SavepointTable:
    """A table of a canonical savepoint: one state (or the timers) of a keyed function, or one
    store of Spark's operator, as Parquet files under ``path`` (relative to the savepoint)."""

    state: str
    kind: str  # value, list, map, reducing, aggregating, operator_list, timers, or store
    store_name: str
    path: str
    rows: int


@dataclass(frozen=True)
class SavepointOperator:
    """An operator whose state a savepoint holds."""

    operator_id: int
    name: str  # Spark's operator name (``keyedProcess`` for a keyed function)
    stores: list[str]
    function: str  # the keyed function ("" for Spark's operators)
    uid: str  # its uid ("" if none)
    tables: list[SavepointTable]  # a canonical savepoint's tables (none in a native one)


@dataclass(frozen=True)
class SavepointInfo:
    """A savepoint's metadata (``_savepoint.json``): where its state comes from, what it holds."""

    path: str
    format: str
    keyedstate_version: str
    spark_version: str
    created_at_ms: int
    source: str
    batch_id: int
    state_version: int
    partitions: int
    provider: str
    source_checkpoint_ids: bool
    operators: list[SavepointOperator]
    files: int
    bytes: int


@dataclass(frozen=True)
class RestoreResult:
    """What ``restore_savepoint`` did."""

    savepoint: str
    checkpoint: str
    batch_id: int
    from_partitions: int
    to_partitions: int
    bytes: int
    total_ms: int


def _operator(raw: dict[str, Any]) -> SavepointOperator:
    tables = [decode(SavepointTable, t) for t in raw.get("tables", [])]
    return decode(SavepointOperator, {**raw, "tables": tables})


def savepoint_command(spark: SparkSession, command: str, *args: Any) -> Any:  # noqa: ANN401
    """The JVM's ``SavepointCommands.<command>(session, *args)``, its JSON answer parsed."""
    return json.loads(operation(spark, f"savepoint.{command}", *args))


def savepoint_info(path: str, raw: dict[str, Any]) -> SavepointInfo:
    """A savepoint's metadata as the JVM returned it (JSON), for the savepoint at ``path``."""
    files = raw.get("files", [])
    values = {snake(k): v for k, v in raw.items()}
    return SavepointInfo(
        path=path,
        operators=[_operator(o) for o in raw["operators"]],
        files=len(files),
        bytes=sum(f["size"] for f in files),
        **{
            f.name: values[f.name]
            for f in fields(SavepointInfo)
            if f.name not in ("path", "operators", "files", "bytes")
        },
    )


FORMATS = ("native", "canonical")


def savepoint(
    spark: SparkSession, checkpoint: str, target: str, *, format: str = "native"
) -> SavepointInfo:
    """Take a savepoint of a query's state at ``target``: every operator's state at the
    checkpoint's last committed batch, with the query's logs up to it. The query may be running
    (it goes on; its later batches are not in the savepoint) or stopped. Flink's
    ``flink savepoint --type native|canonical``: ``native`` copies the provider's files (fast;
    restores into keyedstate's provider), ``canonical`` writes each state as Parquet tables
    (readable by anything that reads Parquet; restores into any provider that holds the
    operator's state)."""
    _check_format(format)
    raw = savepoint_command(spark, "create", checkpoint, target, format)
    return savepoint_info(target, raw)


def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"Invalid savepoint format {format!r}: allowed are {', '.join(FORMATS)}")


def stop_with_savepoint(
    query: Any,  # noqa: ANN401 - a StreamingQuery
    target: str,
    *,
    format: str = "native",
) -> SavepointInfo:
    """Stop ``query`` and take a savepoint of its last committed batch (Flink's ``flink stop
    --savepointPath``). A batch in flight when it stops is not committed and not in the
    savepoint: a query restored from it runs that batch again, exactly once."""
    _check_format(format)
    if is_connect(query):
        # The query runs in the server's session of the client's: the savepoint is taken there.
        spark = query._session
        checkpoint = json.loads(operation(spark, "query.info", str(query.id)))["checkpoint"]
        query.stop()
        return savepoint(spark, checkpoint, target, format=format)
    checkpoint = query._jsq.streamingQuery().resolvedCheckpointRoot()
    # The query's own session: its file system settings are the ones its checkpoint needs.
    from pyspark import SparkContext

    spark = SparkSession(SparkContext._active_spark_context, query._jsq.sparkSession())
    query.stop()
    return savepoint(spark, checkpoint, target, format=format)


def restore_savepoint(
    spark: SparkSession,
    savepoint: str,
    checkpoint: str,
    *,
    partitions: int | None = None,
    provider: str | None = None,
    allow_non_restored_state: bool = False,
) -> RestoreResult:
    """Write a new checkpoint at ``checkpoint`` from the savepoint at ``savepoint``: the query
    started on it resumes after the savepoint's batch, none replayed and none skipped. With
    ``partitions`` (another count than the savepoint's) the state is rescaled on the way. A
    canonical savepoint's state may go into another state store ``provider`` (a class name,
    e.g. Spark's RocksDB provider for Spark's own operators), which the query then uses.

    The query started on the new checkpoint may differ from the savepoint's: its keyed functions
    get their state by uid (without a uid: by position and class), a new function or state
    starts empty, and a savepoint's function or state the query no longer has fails its start
    unless ``allow_non_restored_state`` (Flink's ``--allowNonRestoredState``) drops it. Spark's
    own stateful operators must stay as they were (Spark refuses another set)."""
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)):
        raise TypeError(f"partitions must be an int, got {partitions!r}")
    if partitions is not None and partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    raw = savepoint_command(
        spark,
        "restore",
        savepoint,
        checkpoint,
        partitions or 0,
        provider or "",
        bool(allow_non_restored_state),
    )
    return decode(RestoreResult, raw)


def inspect_savepoint(
    spark: SparkSession, savepoint: str, *, verify: bool = False
) -> SavepointInfo:
    """A savepoint's metadata; ``verify`` reads every file and checks its size and CRC32C."""
    raw = savepoint_command(spark, "inspect", savepoint, verify)
    return savepoint_info(savepoint, raw)


def list_savepoints(spark: SparkSession, directory: str) -> list[SavepointInfo]:
    """The savepoints directly under ``directory``, oldest first."""
    raw = savepoint_command(spark, "list", directory)
    return [savepoint_info(entry["path"], entry["metadata"]) for entry in raw]


def dispose_savepoint(spark: SparkSession, savepoint: str) -> SavepointInfo:
    """Delete a savepoint: the files it lists and its metadata (nothing else in its folder)."""
    raw = savepoint_command(spark, "dispose", savepoint)
    return savepoint_info(savepoint, raw)
