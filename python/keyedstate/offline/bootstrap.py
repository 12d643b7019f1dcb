"""``keyedstate.state.bootstrap``: state for a new query, built from historical data
(docs/state-processor.md; Flink's ``OperatorTransformation.bootstrapWith`` and
``SavepointWriter``)."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from keyedstate.errors import CheckpointOperationError
from keyedstate.offline.savepoints import SavepointInfo, savepoint_command, savepoint_info

__all__ = ["bootstrap"]

OUTPUT_MODES = ("append", "update")


def bootstrap(
    spark: SparkSession,
    data: DataFrame,
    build: Callable[[DataFrame], DataFrame],
    target: str,
    *,
    output_mode: str = "append",
) -> SavepointInfo:
    """Write, at ``target``, a savepoint holding the state that ``build`` leaves after
    processing the batch DataFrame ``data``, for a new query to start from.

    ``build`` is the stateful part of the streaming query, the same code it runs: it takes a
    streaming DataFrame with ``data``'s schema and applies the keyed functions (with the uids
    the query gives them) or Spark's stateful operators (``groupBy().agg()``, say). It runs over
    ``data`` once, as one micro-batch, in keyedstate's engine (its output is discarded), so the
    state is exactly what the query would hold after processing ``data`` as a stream. A keyed
    function may also be bootstrapped by another function (Flink's
    ``KeyedStateBootstrapFunction``) declaring the same states under the query function's uid.

    The savepoint is canonical (Parquet tables) and holds no source offsets:
    ``restore_savepoint(spark, target, checkpoint)`` writes a checkpoint whose first batch
    starts from the state, at the session's ``spark.sql.shuffle.partitions`` (or
    ``partitions=``), and the query started on it reads its sources from wherever they tell it
    to start. Event-time timers registered while bootstrapping fire in the new query."""
    if output_mode not in OUTPUT_MODES:
        raise ValueError(
            f"Invalid output_mode {output_mode!r} for bootstrap: allowed are append, update"
        )
    work = target.rstrip("/") + ".bootstrapping"
    savepoint_command(spark, "clearBootstrap", work)  # a bootstrap that died: its work is redone
    try:
        data.write.parquet(work + "/input")
        stream = spark.readStream.schema(data.schema).parquet(work + "/input")
        query = (
            build(stream)
            .writeStream.format("noop")
            .outputMode(output_mode)
            .option("checkpointLocation", work + "/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        failure = query.exception()
        if failure is not None:
            raise CheckpointOperationError(f"bootstrap: the bootstrapping query failed: {failure}")
        raw = savepoint_command(spark, "bootstrap", work + "/checkpoint", target)
        return savepoint_info(target, raw)
    finally:
        savepoint_command(spark, "clearBootstrap", work)
