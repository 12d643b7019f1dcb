"""Callbacks about a supervised query, in the spirit of Spark's ``StreamingQueryListener``."""

from __future__ import annotations

from pyspark.sql.streaming import StreamingQuery

__all__ = ["SupervisorListener"]


class SupervisorListener:
    """Override the callbacks you need; each runs on the thread that called ``run``.

    Order for one run: ``on_start`` for every (re)start (attempt 0 first), ``on_restart`` before
    each restart's delay, then either ``on_failure`` (final; nothing else follows) or
    ``on_terminated``. ``on_checkpoint_timeout`` and ``on_min_pause_violated`` come while a
    query runs. An exception raised by a callback is logged and does not affect the query.
    """

    def on_start(self, query: StreamingQuery, attempt: int) -> None:
        """The query started; ``attempt`` counts restarts (0: the first start)."""

    def on_restart(self, attempt: int, cause: BaseException, delay: float) -> None:
        """The query failed with ``cause`` and restarts as ``attempt`` after ``delay`` seconds."""

    def on_failure(self, cause: BaseException) -> None:
        """The query failed for good: ``cause`` is the ``QueryFailedError`` ``run`` raises."""

    def on_terminated(self, query: StreamingQuery | None, cancelled: bool) -> None:
        """The query ended without error: ``cancelled`` when a user stopped it (``stop()``,
        ``query.stop()`` of a query with a repeating trigger, KeyboardInterrupt), else it
        finished by itself (an ``availableNow`` or ``once`` trigger)."""

    def on_checkpoint_timeout(
        self, query: StreamingQuery, batch_id: int | None, elapsed: float
    ) -> None:
        """Batch ``batch_id`` has been running for ``elapsed`` seconds, past the timeout."""

    def on_min_pause_violated(self, query: StreamingQuery, batch_id: int, pause: float) -> None:
        """Batch ``batch_id`` started only ``pause`` seconds after the previous one ended,
        less than the configured minimum pause."""
