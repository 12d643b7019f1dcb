"""Durations for TTL configuration, named as in PyFlink (``pyflink.common.time.Time``)."""

from __future__ import annotations

import datetime as dt

__all__ = ["Duration", "Time"]


class Time:
    """A length of time, kept in milliseconds.

    ``Time.seconds(10)`` is what ``StateTtlConfig.new_builder`` takes, as in Flink.
    """

    __slots__ = ("_ms",)

    def __init__(self, milliseconds: int) -> None:
        if isinstance(milliseconds, bool) or not isinstance(milliseconds, int):
            raise TypeError(f"Time needs whole milliseconds, got {milliseconds!r}")
        self._ms = milliseconds

    @staticmethod
    def milliseconds(milliseconds: int) -> Time:
        return Time(milliseconds)

    @staticmethod
    def seconds(seconds: int | float) -> Time:
        return Time(round(seconds * 1000))

    @staticmethod
    def minutes(minutes: int | float) -> Time:
        return Time(round(minutes * 60_000))

    @staticmethod
    def hours(hours: int | float) -> Time:
        return Time(round(hours * 3_600_000))

    @staticmethod
    def days(days: int | float) -> Time:
        return Time(round(days * 86_400_000))

    @staticmethod
    def of(value: Time | dt.timedelta | int) -> Time:
        """A ``Time`` from a ``Time``, a ``datetime.timedelta`` or a number of milliseconds."""
        if isinstance(value, Time):
            return value
        if isinstance(value, dt.timedelta):
            return Time(round(value.total_seconds() * 1000))
        return Time(value)

    def to_milliseconds(self) -> int:
        return self._ms

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Time) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    def __repr__(self) -> str:
        return f"Time.milliseconds({self._ms})"


class Duration(Time):
    """PyFlink's newer name for a length of time (``Duration.of_seconds(10)``)."""

    __slots__ = ()

    @staticmethod
    def of_millis(millis: int) -> Duration:
        return Duration(millis)

    @staticmethod
    def of_seconds(seconds: int | float) -> Duration:
        return Duration(Time.seconds(seconds)._ms)

    @staticmethod
    def of_minutes(minutes: int | float) -> Duration:
        return Duration(Time.minutes(minutes)._ms)

    @staticmethod
    def of_hours(hours: int | float) -> Duration:
        return Duration(Time.hours(hours)._ms)

    @staticmethod
    def of_days(days: int | float) -> Duration:
        return Duration(Time.days(days)._ms)

    def __repr__(self) -> str:
        return f"Duration.of_millis({self._ms})"
