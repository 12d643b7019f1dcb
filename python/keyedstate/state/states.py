"""Keyed state objects, named as in PyFlink (``pyflink.datastream.state``).

The abstract classes are the API. The implementations read and write the record of the key
being processed, which the engine switches before each element and timer (see
``keyedstate.state.backend``). They are created by ``RuntimeContext.get_state`` and friends,
never directly.

With TTL, a stored value is ``(value, last_access_ms)``; a list element and a map entry each
carry their own timestamp, as in Flink. A value is expired when ``last_access + ttl <= now``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from keyedstate.state.descriptors import (
    AggregatingStateDescriptor,
    KeyedStateError,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from keyedstate.state.types import (
    StateTypeError,
    TypeInformation,
    compile_exact,
    compile_exact_all,
)

if TYPE_CHECKING:
    from keyedstate.state.backend import KeyedStateBackend

__all__ = [
    "AggregatingState",
    "AppendingState",
    "ListState",
    "MapState",
    "MergingState",
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


class MapState(State, Generic[K, V]):
    @abstractmethod
    def get(self, key: K) -> V | None: ...

    @abstractmethod
    def put(self, key: K, value: V) -> None: ...

    @abstractmethod
    def put_all(self, dict_value: Mapping[K, V]) -> None: ...

    @abstractmethod
    def remove(self, key: K) -> None: ...

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

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def __delitem__(self, key: K) -> None:
        self.remove(key)

    def __contains__(self, key: object) -> bool:
        return self.contains(key)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())


# ---------------------------------------------------------------------------------------------
# Implementations


class _Check:
    """Checks values against a declared type: a generated exact test first (no conversion
    needed), then the type's conversion, which normalises (numpy scalars, int to float, tuple to
    list) or raises :class:`StateTypeError` naming the state."""

    __slots__ = ("exact", "exact_all", "_coerce", "_message")

    def __init__(self, descriptor: StateDescriptor, info: TypeInformation, what: str) -> None:
        self.exact = compile_exact(info)
        self.exact_all = compile_exact_all(info)
        self._coerce = info._coerce
        self._message = f"{type(descriptor).__name__[:-10]} '{descriptor.name}' {what}"

    def convert(self, value: Any) -> Any:  # noqa: ANN401
        try:
            return self._coerce(value)
        except StateTypeError as error:
            raise StateTypeError(f"{self._message}: {error}") from None

    def one(self, value: Any) -> Any:  # noqa: ANN401
        exact = self.exact
        return value if exact is not None and exact(value) else self.convert(value)

    def many(self, values: list[Any]) -> list[Any]:
        exact_all = self.exact_all
        if exact_all is not None and exact_all(values):
            return values
        return [self.convert(v) for v in values]


def _checker(descriptor: StateDescriptor, info: TypeInformation, what: str) -> _Check | None:
    """A checker for values of ``info``, or None when the type is unchecked (pickled)."""
    if info.is_pickled():
        return None
    return _Check(descriptor, info, what)


class _Handle:
    """Common part of the implementations: the backend, the name, the TTL settings."""

    __slots__ = ("_b", "_name", "_ttl", "_ttl_ms", "_on_read", "_return_expired", "descriptor")

    def __init__(self, backend: KeyedStateBackend, descriptor: StateDescriptor) -> None:
        self._b = backend
        self._name = descriptor.name
        self.descriptor = descriptor
        ttl = descriptor.ttl_config
        self._ttl = ttl is not None
        self._ttl_ms = ttl.ttl_ms if ttl is not None else 0
        self._on_read = ttl.update_on_read if ttl is not None else False
        self._return_expired = ttl.return_expired if ttl is not None else False

    # TTL helpers, used by the backend on the stored form of this state.
    def expiry(self, stored: Any) -> int | None:  # noqa: ANN401
        """The earliest expiration time of a stored TTL value (None when nothing expires)."""
        return stored[1] + self._ttl_ms

    def purge(self, stored: Any, now: int) -> Any:  # noqa: ANN401
        """The stored value without its expired parts (None when nothing is left)."""
        return None if stored[1] + self._ttl_ms <= now else stored


class _ValueStateImpl(_Handle, ValueState):
    __slots__ = ("_check",)

    def __init__(self, backend: KeyedStateBackend, descriptor: ValueStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check = _checker(descriptor, descriptor.type_info, "holds")

    def value(self) -> Any:  # noqa: ANN401
        return self._b.cur.get(self._name)

    def update(self, value: Any) -> None:  # noqa: ANN401
        if value is None:
            self._b.cur.pop(self._name, None)
            return
        check = self._check
        self._b.cur[self._name] = value if check is None else check.one(value)

    def clear(self) -> None:
        self._b.cur.pop(self._name, None)


class _TtlValueStateImpl(_ValueStateImpl):
    __slots__ = ()

    def value(self) -> Any:  # noqa: ANN401
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            return None
        value, ts = stored
        now = self._b.now
        if ts + self._ttl_ms <= now:
            del cur[self._name]  # cleanup on read
            return value if self._return_expired else None
        if self._on_read:
            cur[self._name] = (value, now)
        return value

    def update(self, value: Any) -> None:  # noqa: ANN401
        if value is None:
            self._b.cur.pop(self._name, None)
            return
        check = self._check
        self._b.cur[self._name] = (value if check is None else check.one(value), self._b.now)


class _ReducingStateImpl(_Handle, ReducingState):
    __slots__ = ("_check", "_reduce")

    def __init__(self, backend: KeyedStateBackend, descriptor: ReducingStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check = _checker(descriptor, descriptor.type_info, "holds")
        self._reduce = descriptor._reduce

    def get(self) -> Any:  # noqa: ANN401
        return self._b.cur.get(self._name)

    def _combine(self, current: Any, value: Any) -> Any:  # noqa: ANN401
        check = self._check
        if value is None:
            raise StateTypeError(f"ReducingState '{self._name}': cannot add None")
        if check is not None:
            value = check.one(value)
        if current is None:
            return value
        reduced = self._reduce(current, value)
        return reduced if check is None else check.one(reduced)

    def add(self, value: Any) -> None:  # noqa: ANN401
        cur = self._b.cur
        cur[self._name] = self._combine(cur.get(self._name), value)

    def clear(self) -> None:
        self._b.cur.pop(self._name, None)


class _TtlReducingStateImpl(_ReducingStateImpl):
    __slots__ = ()

    def _live(self, update_ts: bool) -> Any:  # noqa: ANN401
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            return None
        value, ts = stored
        now = self._b.now
        if ts + self._ttl_ms <= now:
            del cur[self._name]
            return value if self._return_expired else None
        if update_ts and self._on_read:
            cur[self._name] = (value, now)
        return value

    def get(self) -> Any:  # noqa: ANN401
        return self._live(True)

    def add(self, value: Any) -> None:  # noqa: ANN401
        # Flink's TTL reducing state drops an expired accumulator before adding.
        current = self._live(False)
        if current is not None and self._b.cur.get(self._name) is None:
            current = None
        self._b.cur[self._name] = (self._combine(current, value), self._b.now)


class _AggregatingStateImpl(_Handle, AggregatingState):
    __slots__ = ("_check", "_agg")

    def __init__(self, backend: KeyedStateBackend, descriptor: AggregatingStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check = _checker(descriptor, descriptor.type_info, "accumulator")
        self._agg = descriptor.get_agg_function()

    def get(self) -> Any:  # noqa: ANN401
        acc = self._b.cur.get(self._name)
        return None if acc is None else self._agg.get_result(acc)

    def _fold(self, acc: Any, value: Any) -> Any:  # noqa: ANN401
        agg = self._agg
        if acc is None:
            acc = agg.create_accumulator()
        acc = agg.add(value, acc)
        check = self._check
        return acc if check is None else check.one(acc)

    def add(self, value: Any) -> None:  # noqa: ANN401
        cur = self._b.cur
        cur[self._name] = self._fold(cur.get(self._name), value)

    def clear(self) -> None:
        self._b.cur.pop(self._name, None)


class _TtlAggregatingStateImpl(_AggregatingStateImpl):
    __slots__ = ()

    def _live(self, update_ts: bool) -> Any:  # noqa: ANN401
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            return None
        acc, ts = stored
        now = self._b.now
        if ts + self._ttl_ms <= now:
            del cur[self._name]
            return acc if self._return_expired else None
        if update_ts and self._on_read:
            cur[self._name] = (acc, now)
        return acc

    def get(self) -> Any:  # noqa: ANN401
        acc = self._live(True)
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:  # noqa: ANN401
        acc = self._live(False)
        if acc is not None and self._b.cur.get(self._name) is None:
            acc = None
        self._b.cur[self._name] = (self._fold(acc, value), self._b.now)


class _ListStateImpl(_Handle, ListState):
    __slots__ = ("_check",)

    def __init__(self, backend: KeyedStateBackend, descriptor: ListStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check = _checker(descriptor, descriptor.element_type_info, "element")

    def _element(self, value: Any) -> Any:  # noqa: ANN401
        if value is None:
            raise StateTypeError(f"ListState '{self._name}': cannot add None")
        check = self._check
        return value if check is None else check.one(value)

    def _elements(self, values: Iterable[Any], method: str) -> list[Any]:
        if values is None:
            raise StateTypeError(f"ListState '{self._name}': {method} needs a list, got None")
        new = list(values)
        check = self._check
        if check is None:
            if None in new:
                raise StateTypeError(f"ListState '{self._name}': cannot add None")
            return new
        exact_all = check.exact_all
        if exact_all is not None and exact_all(new):
            return new
        return [self._element(v) for v in new]

    def get(self) -> list:
        stored = self._b.cur.get(self._name)
        return [] if stored is None else list(stored)

    def add(self, value: Any) -> None:  # noqa: ANN401
        value = self._element(value)
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            cur[self._name] = [value]
        else:
            stored.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        new = self._elements(values, "add_all")
        if not new:
            return
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            cur[self._name] = new
        else:
            stored.extend(new)

    def update(self, values: Iterable[Any]) -> None:
        new = self._elements(values, "update")
        if new:
            self._b.cur[self._name] = new
        else:
            self._b.cur.pop(self._name, None)

    def clear(self) -> None:
        self._b.cur.pop(self._name, None)


class _TtlListStateImpl(_ListStateImpl):
    """Each element is stored as ``(element, last_access_ms)``."""

    __slots__ = ()

    def expiry(self, stored: Any) -> int | None:  # noqa: ANN401
        return min(ts for _, ts in stored) + self._ttl_ms

    def purge(self, stored: Any, now: int) -> Any:  # noqa: ANN401
        limit = now - self._ttl_ms
        live = [e for e in stored if e[1] > limit]
        return live or None

    def get(self) -> list:
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            return []
        now = self._b.now
        limit = now - self._ttl_ms
        live = [e for e in stored if e[1] > limit]
        if len(live) != len(stored):
            result = [v for v, _ in (stored if self._return_expired else live)]
            if live:
                cur[self._name] = live
            else:
                del cur[self._name]
        else:
            result = [v for v, _ in stored]
        if self._on_read and live:
            cur[self._name] = [(v, now) for v, _ in live]
        return result

    def add(self, value: Any) -> None:  # noqa: ANN401
        value = self._element(value)
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            cur[self._name] = [(value, self._b.now)]
        else:
            stored.append((value, self._b.now))

    def add_all(self, values: Iterable[Any]) -> None:
        now = self._b.now
        new = [(v, now) for v in self._elements(values, "add_all")]
        if not new:
            return
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            cur[self._name] = new
        else:
            stored.extend(new)

    def update(self, values: Iterable[Any]) -> None:
        now = self._b.now
        new = [(v, now) for v in self._elements(values, "update")]
        if new:
            self._b.cur[self._name] = new
        else:
            self._b.cur.pop(self._name, None)


class _MapStateImpl(_Handle, MapState):
    __slots__ = ("_check_key", "_check_value")

    def __init__(self, backend: KeyedStateBackend, descriptor: MapStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check_key = _checker(descriptor, descriptor.key_type_info, "key")
        self._check_value = _checker(descriptor, descriptor.value_type_info, "value")

    def _key(self, key: Any) -> Any:  # noqa: ANN401
        check = self._check_key
        return key if check is None else check.one(key)

    def _map(self) -> dict:
        stored = self._b.cur.get(self._name)
        return {} if stored is None else stored

    def get(self, key: Any) -> Any:  # noqa: ANN401
        stored = self._b.cur.get(self._name)
        return None if stored is None else stored.get(key)

    def put(self, key: Any, value: Any) -> None:  # noqa: ANN401
        key = self._key(key)
        check = self._check_value
        if check is not None and value is not None:
            value = check.one(value)
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            cur[self._name] = {key: value}
        else:
            stored[key] = value

    def put_all(self, dict_value: Mapping[Any, Any]) -> None:
        for key, value in dict_value.items():
            self.put(key, value)

    def remove(self, key: Any) -> None:  # noqa: ANN401
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is not None:
            stored.pop(key, None)
            if not stored:
                del cur[self._name]

    def contains(self, key: Any) -> bool:  # noqa: ANN401
        stored = self._b.cur.get(self._name)
        return stored is not None and key in stored

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def is_empty(self) -> bool:
        return not self._b.cur.get(self._name)

    def clear(self) -> None:
        self._b.cur.pop(self._name, None)


class _TtlMapStateImpl(_MapStateImpl):
    """Each entry is stored as ``key -> (value, last_access_ms)``."""

    __slots__ = ()

    def expiry(self, stored: Any) -> int | None:  # noqa: ANN401
        return min(ts for _, ts in stored.values()) + self._ttl_ms

    def purge(self, stored: Any, now: int) -> Any:  # noqa: ANN401
        limit = now - self._ttl_ms
        live = {k: e for k, e in stored.items() if e[1] > limit}
        return live or None

    def _live_map(self, refresh: bool) -> dict:
        """The entries of the current key as ``key -> value``, applying cleanup on read."""
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            return {}
        now = self._b.now
        limit = now - self._ttl_ms
        live = {k: e for k, e in stored.items() if e[1] > limit}
        if len(live) != len(stored):
            result = {k: e[0] for k, e in (stored if self._return_expired else live).items()}
            if live:
                cur[self._name] = live
            else:
                del cur[self._name]
        else:
            result = {k: e[0] for k, e in stored.items()}
        if refresh and self._on_read and live:
            cur[self._name] = {k: (e[0], now) for k, e in live.items()}
        return result

    def get(self, key: Any) -> Any:  # noqa: ANN401
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is None:
            return None
        entry = stored.get(key)
        if entry is None:
            return None
        value, ts = entry
        now = self._b.now
        if ts + self._ttl_ms <= now:
            del stored[key]
            if not stored:
                del cur[self._name]
            return value if self._return_expired else None
        if self._on_read:
            stored[key] = (value, now)
        return value

    def put(self, key: Any, value: Any) -> None:  # noqa: ANN401
        key = self._key(key)
        check = self._check_value
        if check is not None and value is not None:
            value = check.one(value)
        cur = self._b.cur
        stored = cur.get(self._name)
        entry = (value, self._b.now)
        if stored is None:
            cur[self._name] = {key: entry}
        else:
            stored[key] = entry

    def contains(self, key: Any) -> bool:  # noqa: ANN401
        stored = self._b.cur.get(self._name)
        if stored is None or key not in stored:
            return False
        if stored[key][1] + self._ttl_ms <= self._b.now:
            # Flink: an expired entry is absent (and cleaned up), whatever the visibility.
            self.get(key)
            return False
        return True

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._live_map(True).items())

    def keys(self) -> list[Any]:
        return list(self._live_map(True).keys())

    def values(self) -> list[Any]:
        return list(self._live_map(True).values())

    def is_empty(self) -> bool:
        return not self._live_map(False)


_IMPLEMENTATIONS: dict[str, tuple[type[_Handle], type[_Handle]]] = {
    "value": (_ValueStateImpl, _TtlValueStateImpl),
    "list": (_ListStateImpl, _TtlListStateImpl),
    "map": (_MapStateImpl, _TtlMapStateImpl),
    "reducing": (_ReducingStateImpl, _TtlReducingStateImpl),
    "aggregating": (_AggregatingStateImpl, _TtlAggregatingStateImpl),
}

_EXPECTED = {
    "value": ValueStateDescriptor,
    "list": ListStateDescriptor,
    "map": MapStateDescriptor,
    "reducing": ReducingStateDescriptor,
    "aggregating": AggregatingStateDescriptor,
}


def create_handle(backend: KeyedStateBackend, descriptor: StateDescriptor, kind: str) -> _Handle:
    expected = _EXPECTED[kind]
    if not isinstance(descriptor, expected):
        raise KeyedStateError(
            f"get_{kind}_state needs a {expected.__name__}, got {type(descriptor).__name__}"
            if kind != "value"
            else f"get_state needs a ValueStateDescriptor, got {type(descriptor).__name__}"
        )
    plain, with_ttl = _IMPLEMENTATIONS[kind]
    cls = with_ttl if descriptor.ttl_config is not None else plain
    return cls(backend, descriptor)  # type: ignore[call-arg]
