"""Operations on a stopped query's checkpoint: rescale and inspect (through the JVM bridge).

Both run as Spark jobs in the given session (one task per state store partition), so they are
distributed across the session's executors. See docs/rescaling.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import SparkSession

from keyedstate._session import PROVIDER_CLASS
from keyedstate.errors import CheckpointOperationError, first_line, state_error

T = TypeVar("T")

def _call(method: Any, *args: Any) -> Any:
    """``method(*args)`` in the JVM. A failure is a ``CheckpointOperationError``: keyedstate's
    own (the store, the version, the file), found among the causes of Spark's wrappers (a failed
    job, a state-store error class), also of its family's class (``keyedstate.errors``); else
    the error's first line. Spark's job failures embed executor stack traces: never shown.

    pyspark converts some JVM errors (``IllegalArgumentException``, Spark's error classes) into
    its ``CapturedException`` classes before they reach here; the rest stay ``Py4JJavaError``."""
    try:
        return method(*args)
    except (Py4JJavaError, CapturedException) as e:
        mapped = state_error(e, operation=True)
        if mapped is None:
            java = e.java_exception if isinstance(e, Py4JJavaError) else None
            line = first_line(java) if java is not None else str(e).splitlines()[0]
            mapped = CheckpointOperationError(line or str(e))
        raise mapped from e


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _decode(cls: type[T], raw: dict[str, Any]) -> T:
    """A result dataclass from the JVM's JSON (camelCase field names, same fields)."""
    values = {_snake(k): v for k, v in raw.items()}
    return cls(**{f.name: values[f.name] for f in fields(cls)})  # type: ignore[call-arg]


@dataclass(frozen=True)
class RescaleResult:
    """What ``rescale`` did."""

    source: str
    output: str
    in_place: bool
    from_partitions: int
    to_partitions: int
    batch_id: int
    state_version: int
    operators: list[int]
    stores: int
    keys: int
    bytes_written: int
    split_ms: int
    build_ms: int
    total_ms: int
    resumed: bool


@dataclass(frozen=True)
class PartitionReport:
    """One store partition of a checkpoint."""

    operator_id: int
    store_name: str
    partition: int
    version: int
    keys: int
    file_bytes: int
    data_bytes: int
    misplaced_keys: int
    key_group_skew: float  # the heaviest key group's bytes over the non-empty ones' mean
    key_group_keys: list[int] = field(repr=False)
    key_group_bytes: list[int] = field(repr=False)


@dataclass(frozen=True)
class OperatorReport:
    operator_id: int
    operator_name: str
    function: str  # the keyed function that wrote the state ("" for Spark's operators)
    uid: str  # the uid it was given ("" if none)
    stores: list[str]
    keys: int
    file_bytes: int
    partition_skew: float
    key_group_skew: float


@dataclass(frozen=True)
class InspectReport:
    """``inspect``'s result: per operator and per store partition."""

    checkpoint: str
    batch_id: int
    state_version: int
    partitions: int
    provider: str
    key_groups: int
    operators: list[OperatorReport]
    partition_reports: list[PartitionReport]


def _entry_point(spark: SparkSession, name: str, package: str = "rescale") -> tuple[Any, Any]:
    """The JVM object ``io.keyedstate.<package>.<name>`` and the session's JVM side."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    if jvm is None:
        raise RuntimeError("the SparkSession has no JVM (Spark Connect is not supported here)")
    entry = getattr(getattr(jvm.io.keyedstate, package), name)
    if not isinstance(entry, JavaClass):
        raise RuntimeError(
            f"{PROVIDER_CLASS} is not on the session's classpath; build the session with "
            "keyedstate.configure(SparkSession.builder)"
        )
    return entry, spark._jsparkSession  # type: ignore[attr-defined]


def rescale(
    spark: SparkSession,
    checkpoint: str,
    partitions: int,
    output: str | None = None,
    *,
    in_place: bool = False,
) -> RescaleResult:
    """Rewrite the state of a stopped query's checkpoint for ``partitions`` state partitions.

    The state of the last committed batch is split by key group and rebuilt for the new count;
    the offset log and operator metadata then pin the new count, so the query restarted on the
    result runs with ``partitions`` partitions. By default the result is a new checkpoint at
    ``output`` (``<checkpoint>-rescaled-<partitions>`` if not given) and the source is only
    read; ``in_place=True`` rewrites the source, crash-safely (an interrupted run is completed
    or undone by the next call). Progress is printed to the driver's standard error.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise TypeError(f"partitions must be an int, got {partitions!r}")
    rescaler, session = _entry_point(spark, "Rescaler")
    raw = json.loads(
        _call(rescaler.rescale, session, checkpoint, partitions, output or "", in_place)
    )
    return _decode(RescaleResult, raw)


def inspect(spark: SparkSession, checkpoint: str, *, key_groups: int = 128) -> InspectReport:
    """Keys, bytes and key-group skew per operator and state partition of a checkpoint."""
    inspector, session = _entry_point(spark, "CheckpointInspector")
    raw = json.loads(_call(inspector.report, session, checkpoint, key_groups))
    report = _decode(InspectReport, raw)
    return dataclasses.replace(
        report,
        operators=[_decode(OperatorReport, o) for o in raw["operators"]],
        partition_reports=[_decode(PartitionReport, p) for p in raw["partitionReports"]],
    )


def read_state(
    spark: SparkSession,
    checkpoint: str,
    state_name: str,
    operator_id: int | None = None,
    *,
    uid: str | None = None,
) -> Any:  # noqa: ANN401 - a pyspark DataFrame
    """The stored values of one state of a keyed function, at the checkpoint's last committed
    batch: a DataFrame with ``partition_id``, the key columns and ``value`` (one row per key, per
    list element, or per map entry with ``user_map_key``). ``state_name`` may also be
    ``"$eventTimers"`` or ``"$procTimers"`` (``timestamp`` and the key columns). Values have the
    state's Spark type (pickled types are ``binary``). When a query has several keyed functions,
    ``uid`` (the name given with ``process(..., uid=...)``) or ``operator_id`` picks one: they
    are numbered 1000, 1001, ... in the order the query applies them (a chain's first function
    is 1000)."""
    from pyspark.sql import DataFrame

    reader = spark._jvm.io.keyedstate.process.StateReader  # type: ignore[attr-defined]
    operator = -1 if operator_id is None else int(operator_id)
    jdf = _call(reader.read, spark._jsparkSession, checkpoint, state_name, operator, uid)
    return DataFrame(jdf, spark)


# ---------------------------------------------------------------------------------------------
# Savepoints (docs/savepoints.md)


@dataclass(frozen=True)
class SavepointOperator:
    """An operator whose state a savepoint holds."""

    operator_id: int
    name: str  # Spark's operator name (``keyedProcess`` for a keyed function)
    stores: list[str]
    function: str  # the keyed function ("" for Spark's operators)
    uid: str  # its uid ("" if none)


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
    checkpoint_ids: bool
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


def _savepoint_info(path: str, raw: dict[str, Any]) -> SavepointInfo:
    files = raw.get("files", [])
    values = {_snake(k): v for k, v in raw.items()}
    return SavepointInfo(
        path=path,
        operators=[_decode(SavepointOperator, o) for o in raw["operators"]],
        files=len(files),
        bytes=sum(f["size"] for f in files),
        **{
            f.name: values[f.name]
            for f in fields(SavepointInfo)
            if f.name not in ("path", "operators", "files", "bytes")
        },
    )


def savepoint(spark: SparkSession, checkpoint: str, target: str) -> SavepointInfo:
    """Take a native savepoint of a query's state at ``target``: every operator's state at the
    checkpoint's last committed batch, with the query's logs up to it. The query may be running
    (it goes on; its later batches are not in the savepoint) or stopped. Flink's
    ``flink savepoint``."""
    savepoints, session = _entry_point(spark, "SavepointCommands", "savepoint")
    raw = json.loads(_call(savepoints.create, session, checkpoint, target))
    return _savepoint_info(target, raw)


def stop_with_savepoint(query: Any, target: str) -> SavepointInfo:  # noqa: ANN401 - a StreamingQuery
    """Stop ``query`` and take a savepoint of its last committed batch (Flink's ``flink stop
    --savepointPath``). A batch in flight when it stops is not committed and not in the
    savepoint: a query restored from it runs that batch again, exactly once."""
    checkpoint = query._jsq.streamingQuery().resolvedCheckpointRoot()
    # The query's own session: its file system settings are the ones its checkpoint needs.
    from pyspark import SparkContext

    spark = SparkSession(SparkContext._active_spark_context, query._jsq.sparkSession())
    query.stop()
    return savepoint(spark, checkpoint, target)


def restore_savepoint(
    spark: SparkSession, savepoint: str, checkpoint: str, *, partitions: int | None = None
) -> RestoreResult:
    """Write a new checkpoint at ``checkpoint`` from the savepoint at ``savepoint``: the query
    started on it resumes after the savepoint's batch, none replayed and none skipped. With
    ``partitions`` (another count than the savepoint's) the state is rescaled on the way."""
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)):
        raise TypeError(f"partitions must be an int, got {partitions!r}")
    if partitions is not None and partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    savepoints, session = _entry_point(spark, "SavepointCommands", "savepoint")
    raw = json.loads(_call(savepoints.restore, session, savepoint, checkpoint, partitions or 0))
    return _decode(RestoreResult, raw)


def inspect_savepoint(
    spark: SparkSession, savepoint: str, *, verify: bool = False
) -> SavepointInfo:
    """A savepoint's metadata; ``verify`` reads every file and checks its size and CRC32C."""
    savepoints, session = _entry_point(spark, "SavepointCommands", "savepoint")
    raw = json.loads(_call(savepoints.inspect, session, savepoint, verify))
    return _savepoint_info(savepoint, raw)


def list_savepoints(spark: SparkSession, directory: str) -> list[SavepointInfo]:
    """The savepoints directly under ``directory``, oldest first."""
    savepoints, session = _entry_point(spark, "SavepointCommands", "savepoint")
    raw = json.loads(_call(savepoints.list, session, directory))
    return [_savepoint_info(entry["path"], entry["metadata"]) for entry in raw]


def dispose_savepoint(spark: SparkSession, savepoint: str) -> SavepointInfo:
    """Delete a savepoint: the files it lists and its metadata (nothing else in its folder)."""
    savepoints, session = _entry_point(spark, "SavepointCommands", "savepoint")
    raw = json.loads(_call(savepoints.dispose, session, savepoint))
    return _savepoint_info(savepoint, raw)
