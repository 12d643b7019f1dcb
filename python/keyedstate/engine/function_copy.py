"""A copy of a keyed function, by value, as an executor gets it.

The planner runs ``open()`` on such a copy (so nothing it does reaches what is shipped), and
every task runs on one of its own. Spark broadcast variables are not copied but shared: one
loads only in executors, and pickles only on the driver.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from pyspark import Broadcast, cloudpickle

__all__ = ["copy_function"]


def copy_function(function: Any) -> Any:  # noqa: ANN401
    shared: dict[int, Broadcast] = {}

    class _Pickler(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:  # noqa: ANN401
            if isinstance(obj, Broadcast):
                shared[id(obj)] = obj
                return id(obj)
            return None

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:  # noqa: ANN401
            return shared[pid]

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(function)
    return _Unpickler(io.BytesIO(buffer.getvalue())).load()
