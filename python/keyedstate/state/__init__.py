"""Keyed state: descriptors, state objects, TTL, types and time (PyFlink's names)."""

from keyedstate.state.descriptors import (
    AggregatingStateDescriptor,
    KeyedStateError,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from keyedstate.state.states import (
    AggregatingState,
    AppendingState,
    ListState,
    MapState,
    MergingState,
    ReducingState,
    State,
    ValueState,
)
from keyedstate.state.time import Duration, Time
from keyedstate.state.ttl import StateTtlConfig
from keyedstate.state.types import StateTypeError, TypeInformation, Types, to_type_info

__all__ = [
    "AggregatingState",
    "AggregatingStateDescriptor",
    "AppendingState",
    "Duration",
    "KeyedStateError",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "MergingState",
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
    "to_type_info",
]
