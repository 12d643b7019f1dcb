"""Watching a running query's batches from the driver: how long the running batch has been
running (the checkpoint timeout), and the pause before each batch (the minimum pause).

Spark reports a batch only once it has ended (``StreamingQueryListener.onQueryProgress``), so
the running batch is seen by polling ``query.status``: the batch counts from the first poll that
finds the trigger active, which makes the timeout late by at most one poll interval.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQuery

__all__ = ["BatchWatch", "TimedOutBatch", "current_batch_id"]


@dataclass(frozen=True)
class TimedOutBatch:
    batch_id: int | None
    elapsed: float  # seconds


def current_batch_id(query: StreamingQuery) -> int | None:
    """The id of the batch the query is running (or last ran), from the JVM query; None when
    that cannot be read (Spark Connect, or a Spark whose internals differ)."""
    try:
        context = query._jsq.streamingQuery().getLatestExecutionContext()
        return int(context.batchId())
    except Exception:  # noqa: BLE001 - internal API: fall back to the last progress
        progress = last_progress(query)
        return None if progress is None else int(progress["batchId"]) + 1


def last_progress(query: StreamingQuery) -> dict[str, Any] | None:
    progress = query.lastProgress
    if progress is None:
        return None
    return json.loads(progress.json) if hasattr(progress, "json") else dict(progress)


def _parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


class BatchWatch:
    """Polled by the supervisor while a query runs."""

    def __init__(
        self,
        query: StreamingQuery,
        timeout_ms: int,
        min_pause_ms: int,
        clock: Callable[[], float],
    ) -> None:
        self.query = query
        self.timeout_s = timeout_ms / 1000
        self.min_pause_s = min_pause_ms / 1000
        self.clock = clock
        self._timing = False  # whether a running batch is being timed
        self._batch: int | None = None
        self._since = 0.0
        self._reported: set[int | None] = set()
        self._last_seen: dict[str, Any] | None = None

    def poll_timeout(self) -> TimedOutBatch | None:
        """The running batch, the first time it is seen past the timeout."""
        status = self.query.status
        if not status.get("isTriggerActive"):
            self._timing = False
            return None
        batch = current_batch_id(self.query)
        now = self.clock()
        if not self._timing or self._batch != batch:
            self._timing, self._batch, self._since = True, batch, now
            return None
        elapsed = now - self._since
        if elapsed > self.timeout_s and batch not in self._reported:
            self._reported.add(batch)
            return TimedOutBatch(batch, elapsed)
        return None

    def poll_pause(self) -> tuple[int, float] | None:
        """(batch id, pause in seconds) when a newly reported batch started sooner than the
        minimum pause after its predecessor ended."""
        if not self.min_pause_s:
            return None
        progress = last_progress(self.query)
        if progress is None or "addBatch" not in progress.get("durationMs", {}):
            return None
        previous, self._last_seen = self._last_seen, progress
        if previous is None or progress["batchId"] != previous["batchId"] + 1:
            return None
        ended = _parse_time(previous["timestamp"]) + dt.timedelta(
            milliseconds=previous["durationMs"].get("triggerExecution", 0)
        )
        pause = (_parse_time(progress["timestamp"]) - ended).total_seconds()
        if pause < self.min_pause_s:
            return int(progress["batchId"]), max(pause, 0.0)
        return None
