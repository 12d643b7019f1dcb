"""``keyedstate.state.transform``: a new savepoint from an existing one, changed
(docs/state-processor.md; Flink's ``SavepointWriter.fromExistingSavepoint``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping

from pyspark.sql import DataFrame, SparkSession

from keyedstate.offline._bridge import operation
from keyedstate.offline.reader import read
from keyedstate.offline.savepoints import SavepointInfo, savepoint_info

__all__ = ["transform"]

Operator = str | int
Table = tuple[Operator, str]


def transform(
    spark: SparkSession,
    source: str,
    target: str,
    *,
    map_states: Mapping[Table, Callable[[DataFrame], DataFrame]] | None = None,
    drop: Iterable[Operator | Table] = (),
    rename_uids: Mapping[str, str] | None = None,
    add: Mapping[str, str] | None = None,
) -> SavepointInfo:
    """Write at ``target`` a canonical savepoint made from the savepoint at ``source`` (native
    or canonical), changed:

    - ``map_states``: per ``(operator, state)``, a function from the table's rows (as
      ``state.read(..., flatten=False)`` gives them) to its new rows, of the same columns: map,
      filter, fix values. Works for Spark's operators' stores too (``(0, "default")``).
    - ``drop``: keyed functions (a uid or an operator id) or ``(operator, state)`` pairs whose
      state goes (Flink's ``removeOperator``).
    - ``rename_uids``: old uid to new uid (Flink's ``changeOperatorIdentifier``).
    - ``add``: uid to a savepoint holding a keyed function with that uid, typically one
      ``state.bootstrap`` wrote: its state (every state, timers, operator state) is added, and a
      query restored from the result finds it by uid (Flink's ``withOperator``).

    The query's logs stay as they are, so a query restored from the result resumes after the
    same batch; restore it at another partition count with ``restore_savepoint(partitions=)``.
    A state added to a function starts empty when the restored query declares it."""
    replacements = {}
    for (operator, state), change in (map_states or {}).items():
        replacements[f"{operator}\u0000{state}"] = change(
            read(spark, source, operator, state, flatten=False)
        )
    drops = []
    for entry in drop:
        operator, state = entry if isinstance(entry, tuple) else (entry, "")
        drops.append([str(operator), state])
    raw = json.loads(
        operation(
            spark,
            "savepoint.transform",
            source,
            target,
            json.dumps(dict(rename_uids or {})),
            json.dumps(drops),
            json.dumps([[uid, path] for uid, path in (add or {}).items()]),
            frames=replacements,
        )
    )
    return savepoint_info(target, raw)
