"""Keyed state objects, named as in PyFlink (``pyflink.datastream.state``).

These abstract classes are the API; the engine implements them (``keyedstate.engine``) and
``RuntimeContext.get_state`` and friends create them. Every method acts on the key being
processed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

__all__ = [
    "AggregatingState",
    "AppendingState",
    "BroadcastState",
    "ListState",
    "MapState",
    "MergingState",
    "ReadOnlyBroadcastState",
    "ReducingState",
    "State",
    "ValueState",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
IN = TypeVar("IN")
OUT = TypeVar("OUT")


# ---------------------------------------------------------------------------------------------
# The API (PyFlink's interfaces)


class State(ABC):
    """A keyed state: every method acts on the value of the current key."""

    @abstractmethod
    def clear(self) -> None:
        """Removes the value of the current key."""


class ValueState(State, Generic[T]):
    @abstractmethod
    def value(self) -> T | None:
        """The value of the current key, or None."""

    @abstractmethod
    def update(self, value: T | None) -> None:
        """Sets the value of the current key; ``None`` clears it."""


class AppendingState(State, Generic[IN, OUT]):
    @abstractmethod
    def get(self) -> OUT:
        """The value of the current key (see the subclasses)."""

    @abstractmethod
    def add(self, value: IN) -> None:
        """Adds a value to the state of the current key."""


class MergingState(AppendingState[IN, OUT]):
    pass


class ReducingState(MergingState[T, T]):
    """``add`` combines the value with the current one through the reduce function."""


class AggregatingState(MergingState[IN, OUT]):
    """``add`` folds the value into the accumulator; ``get`` returns ``get_result``."""


class ListState(MergingState[T, Iterable[T]]):
    @abstractmethod
    def update(self, values: list[T]) -> None:
        """Replaces the list of the current key (an empty list clears it)."""

    @abstractmethod
    def add_all(self, values: list[T]) -> None:
        """Appends the values to the list of the current key."""

    def __iter__(self) -> Iterator[T]:
        return iter(self.get())


class _ReadableMap(State, Generic[K, V]):
    """The reads a map state and a broadcast state share."""

    @abstractmethod
    def get(self, key: K) -> V | None: ...

    @abstractmethod
    def contains(self, key: K) -> bool: ...

    @abstractmethod
    def items(self) -> Iterable[tuple[K, V]]: ...

    @abstractmethod
    def keys(self) -> Iterable[K]: ...

    @abstractmethod
    def values(self) -> Iterable[V]: ...

    @abstractmethod
    def is_empty(self) -> bool: ...

    def __getitem__(self, key: K) -> V | None:
        return self.get(key)

    def __contains__(self, key: object) -> bool:
        return self.contains(key)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())


class _WritableMap(_ReadableMap[K, V]):
    """The writes a map state and a broadcast state share."""

    @abstractmethod
    def put(self, key: K, value: V) -> None: ...

    @abstractmethod
    def put_all(self, dict_value: Mapping[K, V]) -> None: ...

    @abstractmethod
    def remove(self, key: K) -> None: ...

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def __delitem__(self, key: K) -> None:
        self.remove(key)


class MapState(_WritableMap[K, V]):
    """A map per key."""


class ReadOnlyBroadcastState(_ReadableMap[K, V]):
    """A broadcast state as ``process_element`` sees it: the same map in every partition, read
    only (PyFlink's ``ReadOnlyBroadcastState``)."""


class BroadcastState(ReadOnlyBroadcastState[K, V], _WritableMap[K, V]):
    """A broadcast state as ``process_broadcast_element`` sees it: read and written, the same
    writes in every partition (PyFlink's ``BroadcastState``)."""
