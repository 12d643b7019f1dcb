"""Flink's restart strategies (``RestartStrategies`` in PyFlink) for supervised Spark queries.

A strategy is an immutable configuration; ``new_backoff()`` gives the per-run tracker that the
supervisor feeds with failures, as Flink's ``RestartBackoffTimeStrategy``: ``notify_failure``,
then ``can_restart`` and ``get_backoff_time``. Times are milliseconds on a monotonic clock the
caller passes in, so the trackers are tested without sleeping.
"""

from __future__ import annotations

import math
import random as _random
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass

from keyedstate.runtime.durations import DurationLike, to_millis

__all__ = [
    "ExponentialDelayRestartStrategy",
    "FailureRateRestartStrategy",
    "FixedDelayRestartStrategy",
    "NoRestartStrategy",
    "RestartBackoff",
    "RestartStrategies",
    "RestartStrategy",
    "exponential_delay_restart",
    "failure_rate_restart",
    "fixed_delay_restart",
    "no_restart",
]


def _count(owner: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int of at least {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be an int of at least {minimum}, got {value!r}")
    return value


def _real(owner: str, name: str, value: object, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}: {name} must be {allowed}, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be {allowed}, got {value!r}")
    return float(value)


class RestartBackoff(ABC):
    """The restart decisions of one supervised run (Flink's ``RestartBackoffTimeStrategy``)."""

    @abstractmethod
    def notify_failure(self, now_ms: int) -> None:
        """Record a failure that happened at ``now_ms`` (monotonic milliseconds)."""

    @abstractmethod
    def can_restart(self) -> bool:
        """Whether the failures recorded so far still allow a restart."""

    @abstractmethod
    def get_backoff_time(self) -> int:
        """Milliseconds to wait before the next restart."""

    @abstractmethod
    def exhausted_reason(self) -> str:
        """Why ``can_restart()`` is False, for the final failure's message."""


class RestartStrategy(ABC):
    """A restart strategy's configuration; build one with the functions of this module."""

    @abstractmethod
    def new_backoff(self, rng: _random.Random | None = None) -> RestartBackoff:
        """A fresh tracker for one supervised run (``rng`` draws the jitter, if any)."""


@dataclass(frozen=True)
class NoRestartStrategy(RestartStrategy):
    """Never restart: the first failure is final."""

    def new_backoff(self, rng: _random.Random | None = None) -> RestartBackoff:
        return _NoRestartBackoff()

    def __str__(self) -> str:
        return "no_restart()"


class _NoRestartBackoff(RestartBackoff):
    def notify_failure(self, now_ms: int) -> None:
        pass

    def can_restart(self) -> bool:
        return False

    def get_backoff_time(self) -> int:
        return 0

    def exhausted_reason(self) -> str:
        return "the restart strategy is no_restart()"


@dataclass(frozen=True)
class FixedDelayRestartStrategy(RestartStrategy):
    """Restart up to ``attempts`` times, waiting ``delay_ms`` before each restart."""

    attempts: int
    delay_ms: int

    def new_backoff(self, rng: _random.Random | None = None) -> RestartBackoff:
        return _FixedDelayBackoff(self)

    def __str__(self) -> str:
        return f"fixed_delay_restart(attempts={self.attempts}, delay={self.delay_ms} ms)"


class _FixedDelayBackoff(RestartBackoff):
    def __init__(self, strategy: FixedDelayRestartStrategy) -> None:
        self.strategy = strategy
        self.failures = 0

    def notify_failure(self, now_ms: int) -> None:
        self.failures += 1

    def can_restart(self) -> bool:
        # As Flink: the (attempts + 1)-th failure is final.
        return self.failures <= self.strategy.attempts

    def get_backoff_time(self) -> int:
        return self.strategy.delay_ms

    def exhausted_reason(self) -> str:
        return f"{self.strategy} used all {self.strategy.attempts} restart attempt(s)"


@dataclass(frozen=True)
class FailureRateRestartStrategy(RestartStrategy):
    """Restart after each failure unless ``max_failures_per_interval`` failures fall within one
    ``interval_ms`` (the newest and the oldest of the last that many failures are at most
    ``interval_ms`` apart); wait ``delay_ms`` before each restart."""

    max_failures_per_interval: int
    interval_ms: int
    delay_ms: int

    def new_backoff(self, rng: _random.Random | None = None) -> RestartBackoff:
        return _FailureRateBackoff(self)

    def __str__(self) -> str:
        return (
            f"failure_rate_restart(max_failures_per_interval={self.max_failures_per_interval}, "
            f"interval={self.interval_ms} ms, delay={self.delay_ms} ms)"
        )


class _FailureRateBackoff(RestartBackoff):
    def __init__(self, strategy: FailureRateRestartStrategy) -> None:
        self.strategy = strategy
        # Only the newest max_failures_per_interval failures can decide the rate.
        self.failures: deque[int] = deque(maxlen=strategy.max_failures_per_interval)

    def notify_failure(self, now_ms: int) -> None:
        self.failures.append(now_ms)

    def _window_ms(self) -> int:
        return self.failures[-1] - self.failures[0]

    def can_restart(self) -> bool:
        if len(self.failures) < self.strategy.max_failures_per_interval:
            return True
        return self._window_ms() > self.strategy.interval_ms

    def get_backoff_time(self) -> int:
        return self.strategy.delay_ms

    def exhausted_reason(self) -> str:
        return (
            f"{self.strategy}: {len(self.failures)} failures within {self._window_ms()} ms "
            f"(the limit is {self.strategy.max_failures_per_interval} per "
            f"{self.strategy.interval_ms} ms)"
        )


@dataclass(frozen=True)
class ExponentialDelayRestartStrategy(RestartStrategy):
    """Restart indefinitely, the delay growing from ``initial_backoff_ms`` by
    ``backoff_multiplier`` per failure up to ``max_backoff_ms``; it falls back to the initial
    delay when no failure happened for ``reset_backoff_threshold_ms`` (plus the current delay).
    Each delay gets a uniform jitter of up to +-``jitter_factor`` of itself, capped at the
    maximum."""

    initial_backoff_ms: int
    max_backoff_ms: int
    backoff_multiplier: float
    reset_backoff_threshold_ms: int
    jitter_factor: float

    def new_backoff(self, rng: _random.Random | None = None) -> RestartBackoff:
        return _ExponentialDelayBackoff(self, rng or _random.Random())

    def __str__(self) -> str:
        return (
            f"exponential_delay_restart(initial_backoff={self.initial_backoff_ms} ms, "
            f"max_backoff={self.max_backoff_ms} ms, backoff_multiplier={self.backoff_multiplier}, "
            f"reset_backoff_threshold={self.reset_backoff_threshold_ms} ms, "
            f"jitter_factor={self.jitter_factor})"
        )


class _ExponentialDelayBackoff(RestartBackoff):
    def __init__(self, strategy: ExponentialDelayRestartStrategy, rng: _random.Random) -> None:
        self.strategy = strategy
        self.rng = rng
        self.current_ms = strategy.initial_backoff_ms
        self.last_failure_ms: int | None = None

    def notify_failure(self, now_ms: int) -> None:
        s = self.strategy
        quiet = self.last_failure_ms is None or (
            now_ms - self.last_failure_ms >= s.reset_backoff_threshold_ms + self.current_ms
        )
        if quiet:
            self.current_ms = s.initial_backoff_ms
        else:
            grown = int(self.current_ms * s.backoff_multiplier)
            self.current_ms = max(s.initial_backoff_ms, min(grown, s.max_backoff_ms))
        self.last_failure_ms = now_ms

    def can_restart(self) -> bool:
        return True

    def get_backoff_time(self) -> int:
        offset = int(self.current_ms * self.strategy.jitter_factor)
        jitter = self.rng.randint(-offset, offset) if offset else 0
        return min(self.current_ms + jitter, self.strategy.max_backoff_ms)

    def exhausted_reason(self) -> str:  # never exhausted
        return f"{self.strategy} restarts indefinitely"


# ---------------------------------------------------------------------------------------------
# The PyFlink-style constructors


def no_restart() -> RestartStrategy:
    """No restart: the first failure of the query is final."""
    return NoRestartStrategy()


def fixed_delay_restart(attempts: int, delay: DurationLike) -> RestartStrategy:
    """Restart at most ``attempts`` times (0 or more), waiting ``delay`` before each restart
    (``delay``: a ``timedelta``, a keyedstate ``Time``/``Duration`` or milliseconds)."""
    owner = "fixed_delay_restart"
    return FixedDelayRestartStrategy(
        attempts=_count(owner, "attempts", attempts, 0),
        delay_ms=to_millis(owner, "delay", delay),
    )


def failure_rate_restart(
    max_failures_per_interval: int, interval: DurationLike, delay: DurationLike
) -> RestartStrategy:
    """Restart after each failure, waiting ``delay``, until ``max_failures_per_interval``
    failures happen within one ``interval``: that failure is final."""
    owner = "failure_rate_restart"
    return FailureRateRestartStrategy(
        max_failures_per_interval=_count(
            owner, "max_failures_per_interval", max_failures_per_interval, 1
        ),
        interval_ms=to_millis(owner, "interval", interval, minimum_ms=1),
        delay_ms=to_millis(owner, "delay", delay),
    )


def exponential_delay_restart(
    initial_backoff: DurationLike,
    max_backoff: DurationLike,
    backoff_multiplier: float,
    reset_backoff_threshold: DurationLike,
    jitter_factor: float,
) -> RestartStrategy:
    """Restart indefinitely with an exponentially growing delay, as Flink's exponential-delay
    strategy: ``initial_backoff`` <= ``max_backoff`` (both at least 1 ms),
    ``backoff_multiplier`` > 1, ``reset_backoff_threshold`` at least 1 ms, ``jitter_factor``
    from 0 to 1."""
    owner = "exponential_delay_restart"
    initial_ms = to_millis(owner, "initial_backoff", initial_backoff, minimum_ms=1)
    max_ms = to_millis(owner, "max_backoff", max_backoff, minimum_ms=1)
    if initial_ms > max_ms:
        raise ValueError(
            f"{owner}: initial_backoff must not exceed max_backoff, got initial_backoff="
            f"{initial_backoff!r} ({initial_ms} ms) and max_backoff={max_backoff!r} ({max_ms} ms)"
        )
    multiplier = _real(owner, "backoff_multiplier", backoff_multiplier, "a number above 1")
    if not multiplier > 1:
        raise ValueError(
            f"{owner}: backoff_multiplier must be a number above 1, got {backoff_multiplier!r}"
        )
    jitter = _real(owner, "jitter_factor", jitter_factor, "a number from 0 to 1")
    if not 0 <= jitter <= 1:
        raise ValueError(
            f"{owner}: jitter_factor must be a number from 0 to 1, got {jitter_factor!r}"
        )
    return ExponentialDelayRestartStrategy(
        initial_backoff_ms=initial_ms,
        max_backoff_ms=max_ms,
        backoff_multiplier=multiplier,
        reset_backoff_threshold_ms=to_millis(
            owner, "reset_backoff_threshold", reset_backoff_threshold, minimum_ms=1
        ),
        jitter_factor=jitter,
    )


class RestartStrategies:
    """PyFlink's spelling: ``RestartStrategies.fixed_delay_restart(3, 1000)``."""

    no_restart = staticmethod(no_restart)
    fixed_delay_restart = staticmethod(fixed_delay_restart)
    failure_rate_restart = staticmethod(failure_rate_restart)
    exponential_delay_restart = staticmethod(exponential_delay_restart)


# What run() uses when no strategy is given: Flink's default when checkpointing is on (Flink
# 1.19+), exponential delay with its default settings.
DEFAULT_RESTART_STRATEGY = ExponentialDelayRestartStrategy(
    initial_backoff_ms=1_000,
    max_backoff_ms=60_000,
    backoff_multiplier=1.5,
    reset_backoff_threshold_ms=3_600_000,
    jitter_factor=0.1,
)
