"""Elements: what a keyed function receives per input row (a named tuple of the row's columns)."""

from __future__ import annotations

from collections import namedtuple
from functools import lru_cache
from typing import Any

__all__ = ["element_class"]


def _rebuild_element(names: tuple[str, ...], values: tuple) -> tuple:
    return element_class(names)._make(values)


@lru_cache(maxsize=256)
def element_class(names: tuple[str, ...]) -> type:
    """A named tuple class for rows with these column names.

    ``value.user_id``, ``value[0]`` and ``value["user_id"]`` all work; ``as_dict()`` gives a
    dict. Instances pickle by column names, so elements can be kept in state.
    """
    base = namedtuple("Element", names, rename=True)  # type: ignore[misc]
    attribute = dict(zip(names, base._fields, strict=True))

    class Element(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __getitem__(self, item: Any) -> Any:  # noqa: ANN401
            if isinstance(item, str):
                try:
                    return getattr(self, attribute[item])
                except KeyError:
                    raise KeyError(f"no column {item!r}; columns are {list(names)}") from None
            return tuple.__getitem__(self, item)

        def as_dict(self) -> dict[str, Any]:
            return dict(zip(names, self, strict=True))

        asDict = as_dict  # noqa: N815 - pyspark Row's spelling

        def __reduce__(self) -> tuple:
            return (_rebuild_element, (names, tuple(self)))

        def __repr__(self) -> str:
            inner = ", ".join(f"{n}={v!r}" for n, v in zip(names, self, strict=True))
            return f"Element({inner})"

    return Element
