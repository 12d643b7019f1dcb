"""``keyedstate.state.read``: one table of a checkpoint's or savepoint's state as a DataFrame
(docs/state-processor.md)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from keyedstate.offline._bridge import call, entry_point
from keyedstate.spark_connect import is_connect

__all__ = ["read"]


def read(
    spark: SparkSession,
    path: str,
    operator: str | int | None = None,
    state: str | None = None,
    *,
    batch_id: int | None = None,
    flatten: bool = True,
) -> DataFrame:
    """The stored state of one operator of a checkpoint (of a running or stopped query) or of a
    native savepoint, at its last committed batch or at ``batch_id``.

    ``operator`` is a keyed function's uid, an operator id (keyed functions are numbered 1000,
    1001, ... in the order the query applies them; Spark's own operators 0, 1, ...), or None for
    the only stateful operator. ``state`` is one of its states, ``"$eventTimers"`` or
    ``"$procTimers"``, or a store of Spark's operator (a stream-stream join has four), or None
    for its only one.

    Every row has ``partition_id``. A keyed function's state has its key columns and ``value``
    (of the state's Spark type; pickled types are ``binary``): a list state one row per element
    and a map state one row per entry with ``user_map_key``, or with ``flatten=False`` one row
    per key with an array or map ``value``. Timers have ``timestamp`` and the key columns;
    operator state ``value`` per element (per partition, as an array, with ``flatten=False``).
    A store of Spark's operator has ``key`` and ``value`` structs, as Spark's ``statestore``
    reader gives them. TTL'd states read as the query sees them at that batch: expired entries
    are hidden."""
    if batch_id is not None and (isinstance(batch_id, bool) or not isinstance(batch_id, int)):
        raise TypeError(f"batch_id must be an int, got {batch_id!r}")
    if operator is not None and (isinstance(operator, bool) or not isinstance(operator, str | int)):
        raise TypeError(f"operator must be a uid (str) or an operator id (int), got {operator!r}")
    # The entry point's arguments: "" for no operator or state, -1 for the last batch.
    batch = -1 if batch_id is None else batch_id
    args = (path, "" if operator is None else str(operator), state or "", batch, flatten)
    if is_connect(spark):
        from keyedstate.spark_connect import relations

        frame = relations.state_read(spark, *args)
        call(lambda: frame.schema)  # planned on the server now: its refusals raised here, mapped
        return frame
    reader, session = entry_point(spark, "StateReader")
    jdf = call(reader.read, session, *args)
    return DataFrame(jdf, spark)
