"""Flink's ``CheckpointConfig`` mapped onto a Spark streaming query (docs/exactly-once.md,
"Checkpoint settings", has the table).

On Spark a checkpoint is a micro-batch: its offsets are logged before it runs, its state is
committed by the provider at its end, then its commit is logged. The settings map as:

* interval -> the processing-time trigger (``DataStreamWriter.trigger(processingTime=...)``);
* min pause -> checked against the interval before the start (Spark starts a batch on the
  interval's ticks, or at once after a batch that overran it, and can wait no longer), and
  every batch that starts sooner than the pause after the previous one ended is reported;
* timeout -> the supervisor watches the running batch: past the timeout it is reported, and with
  ``fail_on_timeout`` the query is stopped and fails with a ``CheckpointTimeoutError``;
* retained checkpoints -> ``spark.sql.streaming.minBatchesToRetain`` (offset and commit logs, and
  the state versions keyedstate keeps);
* tolerable failed checkpoints -> how many consecutive failed checkpoints the supervisor restarts
  at once without asking the restart strategy;
* externalized checkpoint cleanup -> whether a user stop deletes the checkpoint directory;
* checkpoint storage -> the ``checkpointLocation`` option.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter

from keyedstate.runtime.durations import DurationLike, to_millis
from keyedstate.spark_connect import is_instance

__all__ = ["MIN_BATCHES_TO_RETAIN_KEY", "CheckpointConfig", "ExternalizedCheckpointCleanup"]

MIN_BATCHES_TO_RETAIN_KEY = "spark.sql.streaming.minBatchesToRetain"

# Flink's defaults.
DEFAULT_TIMEOUT_MS = 600_000

_T = TypeVar("_T", SparkSession.Builder, SparkSession, DataStreamWriter)


class ExternalizedCheckpointCleanup(enum.Enum):
    """What a user stop (cancel) does with the checkpoint, as Flink's enum of that name."""

    #: Keep the checkpoint directory: the next start resumes from it (Spark's own behaviour).
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"
    #: Delete the checkpoint directory when the user stops the query. A failure keeps it.
    DELETE_ON_CANCELLATION = "DELETE_ON_CANCELLATION"


class CheckpointConfig:
    """Checkpoint settings in Flink's terms; every setter checks its value at once and
    ``validate()`` checks how they combine (``apply`` and ``keyedstate.run`` call it).

    ``CheckpointConfig(interval=1000, timeout=timedelta(seconds=30), fail_on_timeout=True)`` and
    ``CheckpointConfig().set_checkpoint_interval(1000).set_checkpoint_timeout(30_000)`` are the
    same. Durations are a ``timedelta``, a keyedstate ``Time``/``Duration`` or milliseconds.
    """

    def __init__(
        self,
        *,
        interval: DurationLike | None = None,
        min_pause: DurationLike = 0,
        timeout: DurationLike = DEFAULT_TIMEOUT_MS,
        fail_on_timeout: bool = False,
        num_retained: int | None = None,
        tolerable_failed_checkpoints: int = 0,
        cleanup: ExternalizedCheckpointCleanup = (
            ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION
        ),
        checkpoint_storage: str | None = None,
    ) -> None:
        self._interval_ms: int | None = None
        self._min_pause_ms = 0
        self._timeout_ms = DEFAULT_TIMEOUT_MS
        self._fail_on_timeout = False
        self._num_retained: int | None = None
        self._tolerable = 0
        self._cleanup = ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION
        self._storage: str | None = None
        if interval is not None:
            self.set_checkpoint_interval(interval)
        self.set_min_pause_between_checkpoints(min_pause)
        self.set_checkpoint_timeout(timeout)
        self.set_fail_on_checkpoint_timeout(fail_on_timeout)
        if num_retained is not None:
            self.set_num_retained_checkpoints(num_retained)
        self.set_tolerable_checkpoint_failure_number(tolerable_failed_checkpoints)
        self.set_externalized_checkpoint_cleanup(cleanup)
        if checkpoint_storage is not None:
            self.set_checkpoint_storage_dir(checkpoint_storage)

    # -- setters (PyFlink's names) ------------------------------------------------------------

    def set_checkpoint_interval(self, interval: DurationLike) -> CheckpointConfig:
        """The processing-time trigger's interval (at least 1 ms)."""
        self._interval_ms = to_millis("CheckpointConfig", "interval", interval, minimum_ms=1)
        return self

    def set_min_pause_between_checkpoints(self, min_pause: DurationLike) -> CheckpointConfig:
        """The pause wanted between a batch's end and the next batch's start (0: none)."""
        self._min_pause_ms = to_millis("CheckpointConfig", "min_pause", min_pause)
        return self

    def set_checkpoint_timeout(self, timeout: DurationLike) -> CheckpointConfig:
        """How long a batch may run before it is reported (and failed, see
        ``set_fail_on_checkpoint_timeout``); at least 1 ms, Flink's default is 10 minutes."""
        self._timeout_ms = to_millis("CheckpointConfig", "timeout", timeout, minimum_ms=1)
        return self

    def set_fail_on_checkpoint_timeout(self, fail_on_timeout: bool) -> CheckpointConfig:
        """Stop the query with a ``CheckpointTimeoutError`` when a batch runs past the timeout
        (a failed checkpoint); False only reports it."""
        if not isinstance(fail_on_timeout, bool):
            raise TypeError(
                f"CheckpointConfig: fail_on_timeout must be True or False, got {fail_on_timeout!r}"
            )
        self._fail_on_timeout = fail_on_timeout
        return self

    def set_num_retained_checkpoints(self, num_retained: int) -> CheckpointConfig:
        """How many batches' checkpoints Spark keeps (``minBatchesToRetain``, at least 1)."""
        if isinstance(num_retained, bool) or not isinstance(num_retained, int):
            raise TypeError(
                f"CheckpointConfig: num_retained must be an int of at least 1, got {num_retained!r}"
            )
        if num_retained < 1:
            raise ValueError(
                f"CheckpointConfig: num_retained must be an int of at least 1, got {num_retained!r}"
            )
        self._num_retained = num_retained
        return self

    def set_tolerable_checkpoint_failure_number(self, number: int) -> CheckpointConfig:
        """How many consecutive failed checkpoints are restarted at once, without the restart
        strategy (0, Flink's default: every failure goes to the restart strategy)."""
        if isinstance(number, bool) or not isinstance(number, int):
            raise TypeError(
                "CheckpointConfig: tolerable_failed_checkpoints must be an int of at least 0, "
                f"got {number!r}"
            )
        if number < 0:
            raise ValueError(
                "CheckpointConfig: tolerable_failed_checkpoints must be an int of at least 0, "
                f"got {number!r}"
            )
        self._tolerable = number
        return self

    def set_externalized_checkpoint_cleanup(
        self, cleanup: ExternalizedCheckpointCleanup
    ) -> CheckpointConfig:
        """RETAIN_ON_CANCELLATION (default) or DELETE_ON_CANCELLATION."""
        if not isinstance(cleanup, ExternalizedCheckpointCleanup):
            allowed = ", ".join(
                f"ExternalizedCheckpointCleanup.{c.name}" for c in ExternalizedCheckpointCleanup
            )
            raise TypeError(f"CheckpointConfig: cleanup must be one of {allowed}, got {cleanup!r}")
        self._cleanup = cleanup
        return self

    # Flink 1.x's name for the same setting.
    enable_externalized_checkpoints = set_externalized_checkpoint_cleanup

    def set_checkpoint_storage_dir(self, checkpoint_path: str) -> CheckpointConfig:
        """The query's ``checkpointLocation`` (a path or URI Hadoop can open)."""
        if not isinstance(checkpoint_path, str) or not checkpoint_path.strip():
            raise (TypeError if not isinstance(checkpoint_path, str) else ValueError)(
                "CheckpointConfig: checkpoint_storage must be a non-empty path or URI (str), got "
                f"{checkpoint_path!r}"
            )
        self._storage = checkpoint_path
        return self

    # -- getters ------------------------------------------------------------------------------

    def get_checkpoint_interval(self) -> int | None:
        """Milliseconds, or None: the writer's trigger is left as it is."""
        return self._interval_ms

    def get_min_pause_between_checkpoints(self) -> int:
        return self._min_pause_ms

    def get_checkpoint_timeout(self) -> int:
        return self._timeout_ms

    def is_fail_on_checkpoint_timeout(self) -> bool:
        return self._fail_on_timeout

    def get_num_retained_checkpoints(self) -> int | None:
        """None: Spark's setting is left as it is (its default is 100)."""
        return self._num_retained

    def get_tolerable_checkpoint_failure_number(self) -> int:
        return self._tolerable

    def get_externalized_checkpoint_cleanup(self) -> ExternalizedCheckpointCleanup:
        return self._cleanup

    def get_checkpoint_storage_dir(self) -> str | None:
        return self._storage

    # -- validation and application -----------------------------------------------------------

    def validate(self) -> CheckpointConfig:
        """Check how the settings combine (each value was checked by its setter)."""
        if self._min_pause_ms and self._interval_ms is not None:
            if self._min_pause_ms >= self._interval_ms:
                raise ValueError(
                    f"CheckpointConfig: min_pause ({self._min_pause_ms} ms) must be shorter than "
                    f"the interval ({self._interval_ms} ms): Spark starts a batch on every tick "
                    "of the interval (at once after a batch that overran it), so a pause can "
                    "only be kept by an interval longer than the pause plus a batch's duration"
                )
        if self._min_pause_ms and self._interval_ms is None:
            raise ValueError(
                f"CheckpointConfig: min_pause ({self._min_pause_ms} ms) needs an interval: "
                "without a processing-time trigger Spark starts each batch as soon as the "
                "previous one ends; set interval to more than the pause"
            )
        return self

    def apply(self, target: _T) -> _T:
        """Apply the settings that live outside the supervisor, and return ``target``:

        * a ``SparkSession.Builder`` or a ``SparkSession``: ``minBatchesToRetain``;
        * a ``DataStreamWriter``: the processing-time trigger and the ``checkpointLocation``.
        """
        self.validate()
        if is_instance(target, SparkSession.Builder):
            if self._num_retained is not None:
                target.config(MIN_BATCHES_TO_RETAIN_KEY, str(self._num_retained))
            return target
        if is_instance(target, SparkSession):
            if self._num_retained is not None:
                target.conf.set(MIN_BATCHES_TO_RETAIN_KEY, str(self._num_retained))
            return target
        if is_instance(target, DataStreamWriter):
            if self._interval_ms is not None:
                target = target.trigger(processingTime=f"{self._interval_ms} milliseconds")
            if self._storage is not None:
                target = target.option("checkpointLocation", self._storage)
            return target
        raise TypeError(
            "CheckpointConfig.apply: target must be a SparkSession.Builder, a SparkSession or a "
            f"DataStreamWriter, got {type(target).__name__}"
        )

    def __repr__(self) -> str:
        return (
            f"CheckpointConfig(interval={self._interval_ms}, min_pause={self._min_pause_ms}, "
            f"timeout={self._timeout_ms}, fail_on_timeout={self._fail_on_timeout}, "
            f"num_retained={self._num_retained}, "
            f"tolerable_failed_checkpoints={self._tolerable}, cleanup={self._cleanup.name}, "
            f"checkpoint_storage={self._storage!r})"
        )
