"""Durations as the runtime settings take them: PyFlink accepts whole milliseconds (``int``) or a
``datetime.timedelta``; keyedstate's ``Time``/``Duration`` are accepted too."""

from __future__ import annotations

import datetime as dt

from keyedstate.state.time import Time

DurationLike = dt.timedelta | Time | int

ALLOWED = "a datetime.timedelta, a keyedstate Time/Duration or whole milliseconds (int)"


def to_millis(owner: str, name: str, value: object, minimum_ms: int = 0) -> int:
    """``value`` in whole milliseconds, or a ValueError/TypeError naming ``owner``'s argument
    ``name``, the value and what is allowed."""
    if isinstance(value, Time):
        millis = value.to_milliseconds()
    elif isinstance(value, dt.timedelta):
        if value % dt.timedelta(milliseconds=1):
            raise ValueError(
                f"{owner}: {name} must be whole milliseconds, got {value!r} ({ALLOWED})"
            )
        millis = value // dt.timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        millis = value
    else:
        raise TypeError(f"{owner}: {name} must be {ALLOWED}, got {value!r}")
    if millis < minimum_ms:
        raise ValueError(
            f"{owner}: {name} must be at least {minimum_ms} ms, got {value!r} ({millis} ms)"
        )
    return millis
