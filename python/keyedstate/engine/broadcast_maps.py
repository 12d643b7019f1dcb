"""Decoded broadcast maps, kept across the tasks a Python worker runs.

Every state partition holds the same broadcast state, and the lookup node sends a partition's
maps with every micro-batch. A worker process runs task after task, of any partition: it
turns a map's entries into Python values once and hands every later task whose entries are
equal a copy of that (Arrow compares the entry arrays, no Python object is made: microseconds
where decoding 10,000 entries takes milliseconds). One decode is kept per broadcast state: the
one in use.

Only maps whose keys and values cannot change in place are kept (a copy of the dict shares its
values, and a list a function changed in place would reach other partitions), and none with
floating-point values (Arrow takes -0.0 and 0.0 as equal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from keyedstate.state.types import TypeInformation

__all__ = ["DECODED_MAPS", "DecodedMaps", "decoded_once"]


def decoded_once(info: TypeInformation) -> bool:
    """Whether a map's keys or values of this type may be decoded once for several tasks."""
    return info.is_immutable() and not _floating(info)


def _floating(info: TypeInformation) -> bool:
    return info._name in ("FLOAT", "DOUBLE") or any(_floating(c) for c in info.children)


class DecodedMaps:
    """The last decode of each broadcast state, by what names and decodes it (the state's name,
    its types and the session's time zone)."""

    def __init__(self) -> None:
        # key -> (entries, decoded). The entries are a copy, not a view into the Arrow batch
        # they came in (that would keep the whole batch alive).
        self._kept: dict[Any, tuple[pa.Array, dict]] = {}

    def decode(self, key: Any, cell: pa.MapScalar, decode: Callable[[Any], dict]) -> dict:  # noqa: ANN401
        """A fresh dict of ``cell``'s entries: a copy of the last decode under ``key`` if its
        entries are equal, else ``decode(cell.as_py())``, kept in its place."""
        entries = cell.values
        kept = self._kept.get(key)
        if kept is not None and len(kept[0]) == len(entries) and kept[0].equals(entries):
            return dict(kept[1])
        decoded = decode(cell.as_py())
        self._kept[key] = (pa.concat_arrays([entries]), decoded)
        return dict(decoded)


# One per worker process: Spark reuses a worker for task after task (spark.python.worker.reuse).
DECODED_MAPS = DecodedMaps()
