"""The two lookups a broadcast function makes on every element or task, in plain Python: the
broadcast state by descriptor (checked once per descriptor object, refused as before for any
other), and a stored broadcast map decoded once per Python worker while it does not change."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from keyedstate import MapStateDescriptor, Types
from keyedstate.engine.broadcast_maps import DecodedMaps, decoded_once
from keyedstate.engine.contexts import broadcast_views
from keyedstate.engine.keyed_state import KeyState
from keyedstate.state.descriptors import StateUsageError

RULES = MapStateDescriptor("rules", Types.STRING(), Types.LONG())
MAP_TYPE = pa.map_(pa.string(), pa.int64())


def cell(entries: list[tuple[str, int]]) -> Any:  # noqa: ANN401
    """A map cell as the lookup node's Arrow batch holds it."""
    return pa.array([entries], type=MAP_TYPE)[0]


class CountingDecode:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, pairs: list[tuple[str, int]]) -> dict:
        self.calls += 1
        return dict(pairs)


def test_equal_entries_are_decoded_once_and_every_task_gets_its_own_dict() -> None:
    maps, decode = DecodedMaps(), CountingDecode()
    first = maps.decode("rules", cell([("a", 1), ("b", 2)]), decode)
    first["a"] = 100  # a task's writes (process_broadcast_element) stay in its own dict
    second = maps.decode("rules", cell([("a", 1), ("b", 2)]), decode)
    assert second == {"a": 1, "b": 2}
    assert second is not first
    assert decode.calls == 1


def test_other_entries_or_another_state_are_decoded_anew() -> None:
    maps, decode = DecodedMaps(), CountingDecode()
    maps.decode("rules", cell([("a", 1)]), decode)
    assert maps.decode("rules", cell([("a", 2)]), decode) == {"a": 2}
    assert maps.decode("rules", cell([("a", 2), ("b", 1)]), decode) == {"a": 2, "b": 1}
    assert maps.decode("limits", cell([("a", 2), ("b", 1)]), decode) == {"a": 2, "b": 1}
    assert decode.calls == 4
    assert maps.decode("rules", cell([("a", 2), ("b", 1)]), decode) == {"a": 2, "b": 1}
    assert maps.decode("limits", cell([("a", 2), ("b", 1)]), decode) == {"a": 2, "b": 1}
    assert decode.calls == 4


def test_only_the_decode_in_use_is_kept_per_state() -> None:
    maps, decode = DecodedMaps(), CountingDecode()
    for value in (1, 2, 1):
        maps.decode("rules", cell([("a", value)]), decode)
    assert decode.calls == 3


def test_only_maps_of_exactly_compared_immutable_values_are_kept_across_tasks() -> None:
    kept = (
        Types.STRING(),
        Types.LONG(),
        Types.BYTES(),
        Types.SQL_TIMESTAMP(),
        Types.BIG_DEC(),
        Types.TUPLE([Types.STRING(), Types.LONG()]),
    )
    for info in kept:
        assert decoded_once(info), info
    for info in (
        Types.LIST(Types.LONG()),
        Types.MAP(Types.STRING(), Types.LONG()),
        Types.PICKLED_BYTE_ARRAY(),
        Types.DOUBLE(),  # Arrow takes -0.0 and 0.0 as equal
        Types.FLOAT(),
        Types.ROW_NAMED(["a"], [Types.DOUBLE()]),
    ):
        assert not decoded_once(info), info


def test_a_descriptor_is_checked_once_and_another_one_still_refused() -> None:
    backend = KeyState({RULES.name: RULES.signature()})
    read_only, _ = broadcast_views(backend, [RULES])
    state = read_only.of(RULES)
    assert read_only.of(RULES) is state
    same = MapStateDescriptor("rules", Types.STRING(), Types.LONG())
    assert read_only.of(same) is state
    with pytest.raises(StateUsageError, match="declared as"):
        read_only.of(MapStateDescriptor("rules", Types.STRING(), Types.STRING()))
    with pytest.raises(StateUsageError, match="no broadcast state"):
        read_only.of(MapStateDescriptor("other", Types.STRING(), Types.LONG()))
    with pytest.raises(StateUsageError, match="no broadcast state"):
        read_only.of("rules")  # type: ignore[arg-type]


def test_descriptors_made_per_element_are_each_checked() -> None:
    backend = KeyState({RULES.name: RULES.signature()})
    read_only, _ = broadcast_views(backend, [RULES])
    for _ in range(100):
        assert read_only.of(MapStateDescriptor("rules", Types.STRING(), Types.LONG()))
    assert len(read_only._checked) <= 16
    with pytest.raises(StateUsageError, match="declared as"):
        read_only.of(MapStateDescriptor("rules", Types.STRING(), Types.STRING()))
