"""State descriptors, named as in PyFlink (``pyflink.datastream.state``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from keyedstate.errors import KeyedStateError
from keyedstate.state.ttl import StateTtlConfig
from keyedstate.state.types import TypeInformation, Types, to_type_info

__all__ = [
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
]


class StateUsageError(KeyedStateError, ValueError):
    """A misuse of the state API that the engine can detect (names, kinds, modes). Raised in
    Python, so ``error_id`` is ``None``; ``keyedstate.state_error`` finds it behind a query
    that failed with it in a Python worker."""


@runtime_checkable
class _AggregateLike(Protocol):
    def create_accumulator(self) -> Any: ...  # noqa: ANN401

    def add(self, value: Any, accumulator: Any) -> Any: ...  # noqa: ANN401

    def get_result(self, accumulator: Any) -> Any: ...  # noqa: ANN401


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise StateUsageError(f"a state name must be a non-empty str, got {name!r}")
    # Each state is a column family named after it: the names state stores refuse are refused
    # here, before a query starts.
    if name.strip() != name:
        raise StateUsageError(f"a state name must not start or end with spaces, got {name!r}")
    if name == "default" or name[0] in "_$":
        raise StateUsageError(
            f"state name {name!r} is reserved by the state store ('default' and names starting "
            "with '_' or '$'): choose another name"
        )
    return name


class StateDescriptor:
    """Base of the descriptors: a name, a declared type and an optional TTL."""

    kind = "abstract"

    def __init__(self, name: str, type_info: Any) -> None:  # noqa: ANN401
        self.name = _check_name(name)
        self.type_info: TypeInformation = to_type_info(type_info)
        self._ttl_config: StateTtlConfig | None = None
        self._queryable_state_name: str | None = None

    def get_name(self) -> str:
        return self.name

    def set_queryable(self, queryable_state_name: str) -> None:
        """Make the state readable from outside the query, by key, under
        ``queryable_state_name`` (Flink's ``setQueryable``): lookups through
        ``keyedstate.QueryableStateClient`` see the state of the query's last committed batch
        (docs/queryable-state.md). Keyed states only; the name is set once."""
        if not isinstance(queryable_state_name, str) or not queryable_state_name.strip():
            raise StateUsageError(
                f"a queryable state name must be a non-empty str, got {queryable_state_name!r}"
            )
        if queryable_state_name.strip() != queryable_state_name or "/" in queryable_state_name:
            raise StateUsageError(
                "a queryable state name must not start or end with spaces nor contain '/' "
                f"(it is part of the lookup's URL), got {queryable_state_name!r}"
            )
        if self._queryable_state_name is not None:
            raise StateUsageError(
                f"state {self.name!r} is queryable as {self._queryable_state_name!r} already"
            )
        self._queryable_state_name = queryable_state_name

    def get_queryable_state_name(self) -> str | None:
        """The name lookups read the state by (``set_queryable``), or None."""
        return self._queryable_state_name

    def is_queryable(self) -> bool:
        return self._queryable_state_name is not None

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> None:
        """Let the state's values expire (see ``StateTtlConfig``)."""
        if not isinstance(ttl_config, StateTtlConfig):
            raise TypeError(
                "enable_time_to_live needs a StateTtlConfig "
                "(StateTtlConfig.new_builder(Time.seconds(n)).build())"
            )
        self._ttl_config = ttl_config

    @property
    def ttl_config(self) -> StateTtlConfig | None:
        config = self._ttl_config
        return config if config is not None and config.is_enabled() else None

    def signature(self) -> tuple[str, str]:
        """What must stay the same when the same name is registered again."""
        return (self.kind, self.type_info.spark_type().simpleString())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.type_info!r})"


class ValueStateDescriptor(StateDescriptor):
    """A single value per key: ``ValueStateDescriptor("count", Types.LONG())`` or ``(.., int)``."""

    kind = "value"

    def __init__(self, name: str, value_type_info: Any = None) -> None:  # noqa: ANN401
        super().__init__(
            name, Types.PICKLED_BYTE_ARRAY() if value_type_info is None else value_type_info
        )


class ListStateDescriptor(StateDescriptor):
    """A list per key; the declared type is the element type."""

    kind = "list"

    def __init__(self, name: str, elem_type_info: Any = None) -> None:  # noqa: ANN401
        element = to_type_info(
            Types.PICKLED_BYTE_ARRAY() if elem_type_info is None else elem_type_info
        )
        super().__init__(name, Types.LIST(element))
        self.element_type_info = element


class MapStateDescriptor(StateDescriptor):
    """A map per key; declared key and value types."""

    kind = "map"

    def __init__(
        self,
        name: str,
        key_type_info: Any = None,  # noqa: ANN401
        value_type_info: Any = None,  # noqa: ANN401
    ) -> None:
        key = to_type_info(str if key_type_info is None else key_type_info)
        value = to_type_info(
            Types.PICKLED_BYTE_ARRAY() if value_type_info is None else value_type_info
        )
        super().__init__(name, Types.MAP(key, value))
        self.key_type_info = key
        self.value_type_info = value


class ReducingStateDescriptor(StateDescriptor):
    """One value per key, combined with each added value by ``reduce_function(a, b)``.

    ``reduce_function`` is a :class:`keyedstate.ReduceFunction` or any callable of two values.
    """

    kind = "reducing"

    def __init__(
        self,
        name: str,
        reduce_function: Any,  # noqa: ANN401 - a ReduceFunction or a callable
        type_info: Any = None,  # noqa: ANN401
    ) -> None:
        super().__init__(name, Types.PICKLED_BYTE_ARRAY() if type_info is None else type_info)
        reduce = getattr(reduce_function, "reduce", None)
        if callable(reduce):
            self._reduce: Callable[[Any, Any], Any] = reduce
        elif callable(reduce_function):
            self._reduce = reduce_function
        else:
            raise TypeError("reduce_function must be a ReduceFunction or a callable (a, b) -> c")
        self._reduce_function = reduce_function

    def get_reduce_function(self) -> Any:  # noqa: ANN401
        return self._reduce_function


class AggregatingStateDescriptor(StateDescriptor):
    """One accumulator per key, maintained by an :class:`keyedstate.AggregateFunction`.

    The declared type is the accumulator's; ``get()`` returns ``get_result(accumulator)``, whose
    type may differ from the inputs given to ``add``.
    """

    kind = "aggregating"

    def __init__(
        self,
        name: str,
        agg_function: Any,  # noqa: ANN401 - an AggregateFunction
        state_type_info: Any = None,  # noqa: ANN401
    ) -> None:
        super().__init__(
            name, Types.PICKLED_BYTE_ARRAY() if state_type_info is None else state_type_info
        )
        if not isinstance(agg_function, _AggregateLike):
            raise TypeError(
                "agg_function must be an AggregateFunction "
                "(create_accumulator(), add(value, accumulator), get_result(accumulator))"
            )
        self._agg_function = agg_function

    def get_agg_function(self) -> Any:  # noqa: ANN401
        return self._agg_function


# The kinds keyed state is declared with, each with its descriptor; the JVM parses the same names
# (``io.keyedstate.engine.StateKind``, tests/engine/test_state_declaration.py checks they
# agree), and the operator states' kinds: OPERATOR_LIST (even-split redistribution) and
# OPERATOR_UNION_LIST (union redistribution), and BROADCAST.
KEYED_STATE_DESCRIPTORS: dict[str, type[StateDescriptor]] = {
    d.kind: d
    for d in (
        ValueStateDescriptor,
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        AggregatingStateDescriptor,
    )
}
OPERATOR_LIST = "operator_list"
OPERATOR_UNION_LIST = "operator_union_list"
OPERATOR_STATE_KINDS = (OPERATOR_LIST, OPERATOR_UNION_LIST)
# A broadcast state (a map, the same in every partition: keyedstate.broadcast).
BROADCAST = "broadcast"
