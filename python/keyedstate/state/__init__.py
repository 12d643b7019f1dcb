"""Keyed state: descriptors, state objects, TTL, types and time (PyFlink's names), and
the state processor API (docs/state-processor.md): ``read`` stored state, ``bootstrap`` a new
query's state, ``transform`` a savepoint."""

from typing import TYPE_CHECKING, Any

from keyedstate.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateUsageError,
    ValueStateDescriptor,
)
from keyedstate.state.states import (
    AggregatingState,
    AppendingState,
    BroadcastState,
    ListState,
    MapState,
    MergingState,
    ReadOnlyBroadcastState,
    ReducingState,
    State,
    ValueState,
)
from keyedstate.state.time import Duration, Time
from keyedstate.state.ttl import StateTtlConfig
from keyedstate.state.types import StateTypeError, TypeInformation, Types, to_type_info

if TYPE_CHECKING:
    from keyedstate.offline.bootstrap import bootstrap
    from keyedstate.offline.reader import read
    from keyedstate.offline.transform import transform


def __getattr__(name: str) -> Any:  # noqa: ANN401 - the attribute asked for
    # The state processor runs in the JVM: loaded when first used, so that the API modules load
    # no runtime code.
    if name == "read":
        from keyedstate.offline.reader import read

        return read
    if name == "bootstrap":
        from keyedstate.offline.bootstrap import bootstrap

        return bootstrap
    if name == "transform":
        from keyedstate.offline.transform import transform

        return transform
    raise AttributeError(f"module 'keyedstate.state' has no attribute {name!r}")


__all__ = [
    "AggregatingState",
    "AggregatingStateDescriptor",
    "AppendingState",
    "BroadcastState",
    "Duration",
    "StateUsageError",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "MergingState",
    "ReadOnlyBroadcastState",
    "ReducingState",
    "ReducingStateDescriptor",
    "State",
    "StateDescriptor",
    "StateTtlConfig",
    "StateTypeError",
    "Time",
    "TypeInformation",
    "Types",
    "ValueState",
    "ValueStateDescriptor",
    "bootstrap",
    "read",
    "to_type_info",
    "transform",
]
