"""Operations on a stopped query's checkpoint: rescale and inspect (through the JVM bridge).

Both run as Spark jobs in the given session (one task per state store partition), so they are
distributed across the session's executors. See docs/rescaling.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from keyedstate._session import PROVIDER_CLASS


class CheckpointOperationError(RuntimeError):
    """A rescale or inspect refused or failed; the message says why (from the JVM side)."""


def _call(method: Any, *args: Any) -> Any:
    try:
        return method(*args)
    except Py4JJavaError as e:
        message = e.java_exception.getMessage() or e.java_exception.toString()
        raise CheckpointOperationError(str(message)) from e


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
    key_group_keys: list[int] = field(repr=False)
    key_group_bytes: list[int] = field(repr=False)

    @property
    def key_group_skew(self) -> float:
        """The heaviest key group's bytes over the mean of the non-empty ones (1.0 = even)."""
        return _skew(self.key_group_bytes)


@dataclass(frozen=True)
class OperatorReport:
    operator_id: int
    operator_name: str
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


def _skew(values: list[int]) -> float:
    non_empty = [v for v in values if v > 0]
    return max(non_empty) / (sum(non_empty) / len(non_empty)) if non_empty else 1.0


def _entry_point(spark: SparkSession, name: str) -> tuple[Any, Any]:
    """The JVM object ``io.keyedstate.rescale.<name>`` and the session's JVM side."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    if jvm is None:
        raise RuntimeError("the SparkSession has no JVM (Spark Connect is not supported here)")
    entry = getattr(jvm.io.keyedstate.rescale, name)
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
    return RescaleResult(
        source=raw["source"],
        output=raw["output"],
        in_place=raw["inPlace"],
        from_partitions=raw["fromPartitions"],
        to_partitions=raw["toPartitions"],
        batch_id=raw["batchId"],
        state_version=raw["stateVersion"],
        operators=raw["operators"],
        stores=raw["stores"],
        keys=raw["keys"],
        bytes_written=raw["bytesWritten"],
        split_ms=raw["splitMs"],
        build_ms=raw["buildMs"],
        total_ms=raw["totalMs"],
        resumed=raw["resumed"],
    )


def inspect(spark: SparkSession, checkpoint: str, *, key_groups: int = 128) -> InspectReport:
    """Keys, bytes and key-group skew per operator and state partition of a checkpoint."""
    inspector, session = _entry_point(spark, "CheckpointInspector")
    raw = json.loads(_call(inspector.report, session, checkpoint, key_groups))
    return InspectReport(
        checkpoint=raw["checkpoint"],
        batch_id=raw["batchId"],
        state_version=raw["stateVersion"],
        partitions=raw["partitions"],
        provider=raw["provider"],
        key_groups=raw["keyGroups"],
        operators=[
            OperatorReport(
                operator_id=o["operatorId"],
                operator_name=o["operatorName"],
                stores=o["stores"],
                keys=o["keys"],
                file_bytes=o["fileBytes"],
                partition_skew=o["partitionSkew"],
                key_group_skew=o["keyGroupSkew"],
            )
            for o in raw["operators"]
        ],
        partition_reports=[
            PartitionReport(
                operator_id=p["operatorId"],
                store_name=p["storeName"],
                partition=p["partition"],
                version=p["version"],
                keys=p["keys"],
                file_bytes=p["fileBytes"],
                data_bytes=p["dataBytes"],
                misplaced_keys=p["misplacedKeys"],
                key_group_keys=p["keyGroupKeys"],
                key_group_bytes=p["keyGroupBytes"],
            )
            for p in raw["partitionReports"]
        ],
    )
