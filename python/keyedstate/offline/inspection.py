"""``inspect``: keys, bytes and key-group skew per operator and state partition of a checkpoint
(a Spark job, one task per store partition)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from keyedstate.offline._bridge import decode, operation


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


def inspect(spark: SparkSession, checkpoint: str, *, key_groups: int = 128) -> InspectReport:
    """Keys, bytes and key-group skew per operator and state partition of a checkpoint."""
    raw = json.loads(operation(spark, "inspect", checkpoint, key_groups))
    report = decode(InspectReport, raw)
    return dataclasses.replace(
        report,
        operators=[decode(OperatorReport, o) for o in raw["operators"]],
        partition_reports=[decode(PartitionReport, p) for p in raw["partitionReports"]],
    )
