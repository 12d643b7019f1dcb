"""Decoded broadcast maps, kept across the tasks a Python worker runs.

Every state partition holds the same broadcast state, and the lookup node sends a partition's
maps with every micro-batch. A worker process runs task after task, of any partition: it
turns a map's entries into Python values once and hands every later task whose entries are
equal a copy of that (Arrow compares the entry arrays, no Python object is made: microseconds
where decoding 10,000 entries takes milliseconds).

Only maps whose keys and values decode to immutable Python values are kept: a copy of the dict
shares its values, and a list a function changed in place would reach other partitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from keyedstate.state.types import TypeInformation

__all__ = ["DecodedMaps", "immutable"]

# Types whose Python values cannot change in place (str, int, float, bool, bytes, Decimal,
# date, datetime).
_IMMUTABLE = {
    "STRING", "BOOLEAN", "BYTE", "SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "BIG_DEC", "BYTES",
    "SQL_DATE", "SQL_TIMESTAMP",
}  # fmt: skip


def immutable(info: TypeInformation) -> bool:
    return info._name in _IMMUTABLE


class DecodedMaps:
    """The most recent distinct decodes, per codec (what decodes a map also names it: the
    descriptor's types and the session's time zone)."""

    def __init__(self, capacity: int = 8) -> None:
        self._capacity = capacity
        # Most recent first: (codec key, entries, decoded). The entries are a copy, not a view
        # into the Arrow batch they came in (that would keep the whole batch alive).
        self._kept: list[tuple[Any, pa.Array, dict]] = []

    def decode(self, codec: Any, cell: pa.MapScalar, decode: Callable[[Any], dict]) -> dict:  # noqa: ANN401
        """A fresh dict of ``cell``'s entries: a copy of an earlier decode of equal entries
        by the same ``codec``, else ``decode(cell.as_py())``."""
        entries = cell.values
        for i, (key, known, decoded) in enumerate(self._kept):
            if key == codec and len(known) == len(entries) and known.equals(entries):
                if i:
                    self._kept.insert(0, self._kept.pop(i))
                return dict(decoded)
        decoded = decode(cell.as_py())
        self._kept.insert(0, (codec, pa.concat_arrays([entries]), decoded))
        del self._kept[self._capacity :]
        return dict(decoded)


# One per worker process: Spark reuses a worker for task after task (spark.python.worker.reuse).
DECODED_MAPS = DecodedMaps()
