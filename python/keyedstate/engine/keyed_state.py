"""The state of the key being processed, and what changed in it.

The runner loads a key's stored values (one row from the lookup node) into ``cur`` and switches
``cur_key``; the state objects read and write ``cur`` (plain dict operations) and note what they
changed, so that only the changes go back to the store: a value is put or cleared, a list is
appended to (RocksDB merge, nothing read) or replaced, a map has single entries put or removed.
TTL is the provider's (``docs/ttl.md``): it hides expired values from the lookup and stamps what
is written, so nothing here knows about time to live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import is_ as _is
from typing import Any

from keyedstate.state.descriptors import (
    KEYED_STATE_DESCRIPTORS,
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
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from keyedstate.state.types import StateTypeError, _Check, checker

__all__ = ["MIN_TIME", "KeyState", "create_handle"]

MIN_TIME = -(2**63)


class KeyState:
    """The current key's state values and their changes since the key was loaded."""

    __slots__ = (
        "cur",
        "cur_key",
        "now",
        "watermark",
        "handles",
        "declared",
        "dirty",
        "appended",
        "replaced",
        "map_changes",
        "map_cleared",
        "timers",
        "op_state",
        "partition",
        "num_partitions",
        "restored",
    )

    def __init__(self, declared: Mapping[str, tuple[str, str]] | None = None) -> None:
        self.cur: dict[str, Any] = {}
        self.cur_key: Any = None
        self.now = 0
        self.watermark = MIN_TIME
        self.handles: dict[str, _Handle] = {}
        # name -> (kind, Spark type) of the states the planner saw declared; None: record only.
        self.declared = declared
        self.dirty: set[str] = set()
        self.appended: dict[str, list[Any]] = {}
        self.replaced: set[str] = set()
        self.map_changes: dict[str, set[Any]] = {}
        self.map_cleared: set[str] = set()
        # (event_time, timestamp) -> True registered / False deleted, for the current key
        self.timers: dict[tuple[bool, int], bool] = {}
        self.op_state: dict[str, list[Any]] = {}
        self.partition = 0
        self.num_partitions = 1
        self.restored = False

    def register(self, descriptor: StateDescriptor, kind: str) -> _Handle:
        existing = self.handles.get(descriptor.name)
        if existing is not None:
            old = existing.descriptor
            if old.signature() != descriptor.signature() or (old.ttl_config is None) != (
                descriptor.ttl_config is None
            ):
                raise StateUsageError(
                    f"state '{descriptor.name}' is already registered as {old!r}"
                    f"{' with TTL' if old.ttl_config else ''}; cannot register it again as "
                    f"{descriptor!r}{' with TTL' if descriptor.ttl_config else ''}"
                )
            return existing
        if self.declared is not None:
            planned = self.declared.get(descriptor.name)
            if planned is None:
                raise StateUsageError(
                    f"state '{descriptor.name}' was not declared when the query was planned: "
                    "keyedstate learns a function's states by running open() once on the driver, "
                    "so create every state in open() (or initialize_state())"
                )
            if planned != descriptor.signature():
                raise StateUsageError(
                    f"state '{descriptor.name}' was planned as {planned[0]} state of {planned[1]} "
                    f"and is now registered as {descriptor!r}"
                )
        handle = create_handle(self, descriptor, kind)
        self.handles[descriptor.name] = handle
        return handle

    def load(self, key: Any, values: dict[str, Any]) -> None:  # noqa: ANN401
        self.cur_key = key
        self.cur = values
        self.dirty = set()
        self.appended = {}
        self.replaced = set()
        self.map_changes = {}
        self.map_cleared = set()
        self.timers = {}


# ---------------------------------------------------------------------------------------------
# State objects


def _stored_prefix(stored: list[Any] | None, new: list[Any]) -> int:
    """How many leading elements of ``new`` are the trailing elements of ``stored``, the same
    objects (0 if none or not in that shape). ``index`` finds the candidate in C (equality
    short-cuts on identity); identity then decides."""
    if not stored:
        return 0
    try:
        start = stored.index(new[0])
    except Exception:  # noqa: BLE001 - not found, or an element whose == refuses (numpy arrays)
        return 0
    kept = len(stored) - start
    if kept > len(new) or not all(map(_is, new, stored[start:] if start else stored)):
        return 0
    return kept


def _unchecked(value: Any) -> Any:  # noqa: ANN401
    return value


def _one(check: _Check | None) -> Callable[[Any], Any]:
    """The check of one value (a single call in the state methods); unchecked types pass."""
    return _unchecked if check is None else check.one


class _Handle:
    __slots__ = ("_b", "_name", "_refresh", "descriptor")

    def __init__(self, backend: KeyState, descriptor: StateDescriptor) -> None:
        self._b = backend
        self._name = descriptor.name
        self.descriptor = descriptor
        # OnReadAndWrite: what the function reads is written back, which restamps it (the
        # provider stamps writes; the lookup reads every state of a key, so it cannot refresh).
        ttl = descriptor.ttl_config
        self._refresh = ttl is not None and ttl.update_on_read

    def _read(self) -> None:
        if self._refresh:
            self._b.dirty.add(self._name)

    def clear(self) -> None:
        b = self._b
        b.cur.pop(self._name, None)
        b.dirty.add(self._name)


class _ValueStateImpl(_Handle, ValueState):
    __slots__ = ("_value_one",)

    def __init__(self, backend: KeyState, descriptor: ValueStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._value_one = _one(checker(descriptor, descriptor.type_info, "holds"))

    def value(self) -> Any:  # noqa: ANN401
        if self._refresh:
            self._read()
        return self._b.cur.get(self._name)

    def update(self, value: Any) -> None:  # noqa: ANN401
        b = self._b
        if value is None:
            b.cur.pop(self._name, None)
        else:
            b.cur[self._name] = self._value_one(value)
        b.dirty.add(self._name)


class _ReducingStateImpl(_Handle, ReducingState):
    __slots__ = ("_check", "_reduce")

    def __init__(self, backend: KeyState, descriptor: ReducingStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check = checker(descriptor, descriptor.type_info, "holds")
        self._reduce = descriptor._reduce

    def get(self) -> Any:  # noqa: ANN401
        if self._refresh:
            self._read()
        return self._b.cur.get(self._name)

    def add(self, value: Any) -> None:  # noqa: ANN401
        if value is None:
            raise StateTypeError(f"ReducingState '{self._name}': cannot add None")
        check = self._check
        if check is not None:
            value = check.one(value)
        b = self._b
        current = b.cur.get(self._name)
        if current is not None:
            value = self._reduce(current, value)
            if check is not None:
                value = check.one(value)
        b.cur[self._name] = value
        b.dirty.add(self._name)


class _AggregatingStateImpl(_Handle, AggregatingState):
    __slots__ = ("_check", "_agg")

    def __init__(self, backend: KeyState, descriptor: AggregatingStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check = checker(descriptor, descriptor.type_info, "accumulator")
        self._agg = descriptor.get_agg_function()

    def get(self) -> Any:  # noqa: ANN401
        if self._refresh:
            self._read()
        acc = self._b.cur.get(self._name)
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:  # noqa: ANN401
        b = self._b
        agg = self._agg
        acc = b.cur.get(self._name)
        if acc is None:
            acc = agg.create_accumulator()
        acc = agg.add(value, acc)
        check = self._check
        b.cur[self._name] = acc if check is None else check.one(acc)
        b.dirty.add(self._name)


class _ListStateImpl(_Handle, ListState):
    __slots__ = ("_check", "_immutable")

    def __init__(self, backend: KeyState, descriptor: ListStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._check = checker(descriptor, descriptor.element_type_info, "element")
        # Elements of an immutable type that are the stored ones (already checked) need no
        # second check: get(), change the list, update() is the common pattern.
        self._immutable = descriptor.element_type_info.is_immutable()

    def _element(self, value: Any) -> Any:  # noqa: ANN401
        if value is None:
            raise StateTypeError(f"ListState '{self._name}': cannot add None")
        check = self._check
        return value if check is None else check.one(value)

    def _elements(self, values: Iterable[Any], method: str) -> list[Any]:
        """``values`` as a new list of checked elements."""
        if values is None:
            raise StateTypeError(f"ListState '{self._name}': {method} needs a list, got None")
        new = list(values)
        check = self._check
        if check is None or not new:
            return new
        # The stored elements the new list starts with (the same objects, in order, maybe after
        # dropping some from the front: get(), append, trim, update()) were checked when they
        # were stored; only the rest is checked.
        checked = _stored_prefix(self._b.cur.get(self._name), new) if self._immutable else 0
        if checked == len(new):
            return new
        exact_all = check.exact_all
        if exact_all is not None and exact_all(new[checked:] if checked else new):
            return new
        element = self._element
        for i in range(checked, len(new)):
            new[i] = element(new[i])
        return new

    def get(self) -> list:
        stored = self._b.cur.get(self._name)
        if stored is None:
            return []
        if self._refresh and stored:
            b = self._b
            b.replaced.add(self._name)  # rewritten whole: every element restamped
            b.appended.pop(self._name, None)
            b.dirty.add(self._name)
        return stored[:]

    def _append(self, new: list[Any]) -> None:
        b = self._b
        name = self._name
        stored = b.cur.get(name)
        if stored is None:
            b.cur[name] = list(new)
        else:
            stored.extend(new)
        if name not in b.replaced:
            b.appended.setdefault(name, []).extend(new)
        b.dirty.add(name)

    def add(self, value: Any) -> None:  # noqa: ANN401
        self._append([self._element(value)])

    def add_all(self, values: Iterable[Any]) -> None:
        new = self._elements(values, "add_all")
        if new:
            self._append(new)

    def update(self, values: Iterable[Any]) -> None:
        new = self._elements(values, "update")
        b = self._b
        name = self._name
        if new:
            b.cur[name] = new
        else:
            b.cur.pop(name, None)
        b.replaced.add(name)
        b.appended.pop(name, None)
        b.dirty.add(name)

    def clear(self) -> None:
        self.update([])


class _MapStateImpl(_Handle, MapState):
    __slots__ = ("_key_one", "_value_one")

    def __init__(self, backend: KeyState, descriptor: MapStateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self._key_one = _one(checker(descriptor, descriptor.key_type_info, "key"))
        self._value_one = _one(checker(descriptor, descriptor.value_type_info, "value"))

    def _map(self) -> dict:
        stored = self._b.cur.get(self._name)
        if stored is None:
            return {}
        if self._refresh:
            for key in stored:
                self._changed(key)
        return stored

    def _changed(self, key: Any) -> None:  # noqa: ANN401
        b = self._b
        b.map_changes.setdefault(self._name, set()).add(key)
        b.dirty.add(self._name)

    def get(self, key: Any) -> Any:  # noqa: ANN401
        stored = self._b.cur.get(self._name)
        if stored is None:
            return None
        if self._refresh and key in stored:
            self._changed(key)
        return stored.get(key)

    def put(self, key: Any, value: Any) -> None:  # noqa: ANN401
        if key is None:
            raise StateTypeError(f"MapState '{self._name}': a map key cannot be None")
        key = self._key_one(key)
        if value is not None:
            value = self._value_one(value)
        # _changed inline: put runs for every element of a large batch.
        b = self._b
        name = self._name
        stored = b.cur.get(name)
        if stored is None:
            b.cur[name] = {key: value}
        else:
            stored[key] = value
        changes = b.map_changes.get(name)
        if changes is None:
            b.map_changes[name] = {key}
        else:
            changes.add(key)
        b.dirty.add(name)

    def put_all(self, dict_value: Mapping[Any, Any]) -> None:
        for key, value in dict_value.items():
            self.put(key, value)

    def remove(self, key: Any) -> None:  # noqa: ANN401
        cur = self._b.cur
        stored = cur.get(self._name)
        if stored is not None and key in stored:
            del stored[key]
            if not stored:
                del cur[self._name]
            self._changed(key)

    def contains(self, key: Any) -> bool:  # noqa: ANN401
        stored = self._b.cur.get(self._name)
        if stored is not None and self._refresh and key in stored:
            self._changed(key)
        return stored is not None and key in stored

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def is_empty(self) -> bool:
        return not self._map()

    def clear(self) -> None:
        b = self._b
        b.cur.pop(self._name, None)
        b.map_cleared.add(self._name)
        b.map_changes.pop(self._name, None)
        b.dirty.add(self._name)


_IMPLEMENTATIONS: dict[str, type[_Handle]] = {
    ValueStateDescriptor.kind: _ValueStateImpl,
    ListStateDescriptor.kind: _ListStateImpl,
    MapStateDescriptor.kind: _MapStateImpl,
    ReducingStateDescriptor.kind: _ReducingStateImpl,
    AggregatingStateDescriptor.kind: _AggregatingStateImpl,
}


def create_handle(backend: KeyState, descriptor: StateDescriptor, kind: str) -> _Handle:
    expected = KEYED_STATE_DESCRIPTORS[kind]
    if not isinstance(descriptor, expected):
        raise StateUsageError(
            f"get_{kind}_state needs a {expected.__name__}, got {type(descriptor).__name__}"
            if kind != "value"
            else f"get_state needs a ValueStateDescriptor, got {type(descriptor).__name__}"
        )
    return _IMPLEMENTATIONS[kind](backend, descriptor)  # type: ignore[call-arg]
