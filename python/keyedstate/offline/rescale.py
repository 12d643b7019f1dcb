"""``rescale``: a stopped query's state rewritten for another partition count (docs/rescaling.md).

It runs as Spark jobs in the given session (one task per state store partition), so it is
distributed across the session's executors."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import SparkSession

from keyedstate.offline._bridge import decode, operation


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
    raw = json.loads(operation(spark, "rescale", checkpoint, partitions, output or "", in_place))
    return decode(RescaleResult, raw)
