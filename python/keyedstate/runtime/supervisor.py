"""Runs a streaming query and restarts it from its checkpoint when it fails, as Flink restarts a
job: ``keyedstate.run(build, restart_strategy=fixed_delay_restart(3, 1000))``.

``build`` is called for every (re)start and returns a started ``StreamingQuery`` or a
``DataStreamWriter`` (the supervisor applies the ``CheckpointConfig`` to it and starts it); the
query must use the same checkpoint location every time, so a restart resumes from the last
committed batch and the state keyedstate committed with it.
"""

from __future__ import annotations

import enum
import json
import logging
import random as _random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark import SparkContext
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from keyedstate.runtime.batch_watch import BatchWatch
from keyedstate.runtime.checkpoint_config import CheckpointConfig, ExternalizedCheckpointCleanup
from keyedstate.runtime.failures import (
    CheckpointTimeoutError,
    QueryFailedError,
    classify,
    summarize,
)
from keyedstate.runtime.listener import SupervisorListener
from keyedstate.runtime.restart import DEFAULT_RESTART_STRATEGY, RestartStrategy
from keyedstate.spark_connect import is_connect, is_instance

__all__ = ["QueryBuilder", "Supervisor", "run"]

log = logging.getLogger(__name__)

QueryBuilder = Callable[[], "StreamingQuery | DataStreamWriter"]

_CALLBACKS = (
    "on_start",
    "on_restart",
    "on_failure",
    "on_terminated",
    "on_checkpoint_timeout",
    "on_min_pause_violated",
)


class _End(enum.Enum):
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class _Outcome:
    end: _End
    query: StreamingQuery | None = None
    error: BaseException | None = None
    jvm_error: Any = None
    while_starting: bool = False
    committed: bool = False  # a batch committed during the attempt


def _masks_interrupt(error: BaseException) -> bool:
    """Whether ``error`` hides a KeyboardInterrupt. A Ctrl-C that lands while py4j waits on the
    JVM makes py4j shut the call's connection down, and that can fail with an error of its own
    (``Py4JError: Gateway must be connected to send cancel cmd.``) chained to the interrupt."""
    seen: set[int] = set()
    cause = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _label(query: StreamingQuery | None) -> str:
    if query is None:
        return "(not started)"
    return f"'{query.name}'" if query.name else str(query.id)


def _committed_a_batch(query: StreamingQuery) -> bool:
    # A progress with addBatch is reported only after the batch's commit was logged.
    for progress in query.recentProgress:
        data = json.loads(progress.json) if hasattr(progress, "json") else dict(progress)
        if "addBatch" in data.get("durationMs", {}):
            return True
    return False


def _on_server(session: Any, name: str, *arguments: object) -> Any:  # noqa: ANN401 - JSON
    """Operation ``name`` of the Spark Connect server behind ``session`` (a Connect client's
    query runs there, out of py4j's reach): its JSON answer, decoded."""
    from keyedstate.spark_connect import relations

    return json.loads(relations.operation(session, name, list(arguments)))


@dataclass(frozen=True)
class _RunningQuery:
    """What the supervisor reads of a running query: its checkpoint and its trigger."""

    checkpoint: str | None = None
    trigger: str | None = None  # e.g. ProcessingTimeTrigger(1000), AvailableNowTrigger


def _running_query(query: StreamingQuery) -> _RunningQuery:
    try:
        if is_connect(query):
            info = _on_server(query._session, "query.info", str(query.id))
            return _RunningQuery(str(info["checkpoint"]), str(info["trigger"]))
        running = query._jsq.streamingQuery()
        return _RunningQuery(
            str(running.resolvedCheckpointRoot()), str(running.trigger().toString())
        )
    except Exception as error:  # noqa: BLE001 - internal API; callers treat None as unknown
        log.warning(
            "could not read the checkpoint and trigger of streaming query %s: %s",
            _label(query),
            summarize(error),
        )
        return _RunningQuery()


def _hadoop_path(location: str) -> tuple[Any, Any]:  # the file system and the qualified path
    sc = SparkContext._active_spark_context
    if sc is None or sc._jvm is None:
        raise RuntimeError("no active SparkContext to resolve checkpoint location " + location)
    path = sc._jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(sc._jsc.hadoopConfiguration())
    return fs, fs.makeQualified(path)


def _qualified(location: str, connect_session: Any) -> str:  # noqa: ANN401 - a Connect session
    """``location`` as the query's file system names it (scheme and authority added)."""
    if connect_session is not None:
        return str(_on_server(connect_session, "checkpoint.qualify", location))
    return str(_hadoop_path(location)[1].toString())


class Supervisor:
    """Starts a query with ``query_builder``, waits on it and restarts it per the strategy.

    ``run()`` blocks until the query ends: it returns the last query when the query finished by
    itself or was stopped by the user, and raises ``QueryFailedError`` (caused by the last
    failure) when a failure is final. ``stop()`` (from any thread, also from a ``foreachBatch``
    function) ends it as a user stop.
    """

    def __init__(
        self,
        query_builder: QueryBuilder,
        restart_strategy: RestartStrategy | None = None,
        listener: SupervisorListener | None = None,
        checkpoint_config: CheckpointConfig | None = None,
        *,
        spark: SparkSession | None = None,
        poll_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        rng: _random.Random | None = None,
    ) -> None:
        if not callable(query_builder):
            raise TypeError(
                "query_builder must be a callable returning a started StreamingQuery or a "
                f"DataStreamWriter, got {query_builder!r}"
            )
        if restart_strategy is not None and not isinstance(restart_strategy, RestartStrategy):
            raise TypeError(
                "restart_strategy must come from fixed_delay_restart, failure_rate_restart, "
                f"exponential_delay_restart or no_restart, got {restart_strategy!r}"
            )
        if listener is not None and not (
            isinstance(listener, SupervisorListener)
            or any(callable(getattr(listener, name, None)) for name in _CALLBACKS)
        ):
            raise TypeError(
                "listener must be a SupervisorListener or have some of its methods "
                f"({', '.join(_CALLBACKS)}), got {listener!r}"
            )
        if checkpoint_config is not None and not isinstance(checkpoint_config, CheckpointConfig):
            raise TypeError(
                "checkpoint_config must be a keyedstate.CheckpointConfig, got "
                f"{checkpoint_config!r}"
            )
        if spark is not None and not is_instance(spark, SparkSession):
            raise TypeError(f"spark must be a SparkSession, got {spark!r}")
        if (
            isinstance(poll_interval, bool)
            or not isinstance(poll_interval, int | float)
            or not 0 < poll_interval <= 60
        ):
            raise ValueError(
                f"poll_interval must be a number of seconds above 0 and at most 60, got "
                f"{poll_interval!r}"
            )
        if checkpoint_config is not None:
            checkpoint_config.validate()
        self._builder = query_builder
        self._strategy = restart_strategy or DEFAULT_RESTART_STRATEGY
        self._listener = listener
        self._config = checkpoint_config
        self._spark = spark
        self._poll = float(poll_interval)
        self._clock = clock
        self._rng = rng
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ran = False
        self._query: StreamingQuery | None = None
        self._checkpoint: str | None = None
        self._running = _RunningQuery()  # of the latest start
        self._connect_session: Any = None  # a Spark Connect client's query: its session
        self.restarts = 0
        # The latest failures, newest last (bounded: exponential delay restarts forever).
        self.failures: deque[BaseException] = deque(maxlen=100)

    @property
    def query(self) -> StreamingQuery | None:
        """The query of the latest start."""
        return self._query

    def stop(self) -> None:
        """Stop the query as a user stop: no restart follows. Returns at once; ``run`` returns
        once the query has stopped."""
        self._stop.set()

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> StreamingQuery | None:
        with self._lock:
            if self._ran:
                raise RuntimeError("a Supervisor runs once: make a new one to run the query again")
            self._ran = True
        backoff = self._strategy.new_backoff(self._rng)
        tolerable = self._config.get_tolerable_checkpoint_failure_number() if self._config else 0
        tolerated = 0
        try:
            while True:
                if self._stop.is_set():  # stopped before the (re)start
                    return self._ended(cancelled=True)
                outcome = self._attempt()
                if outcome.end is not _End.FAILED:
                    return self._ended(outcome.end is _End.CANCELLED)
                error = outcome.error
                assert error is not None
                self.failures.append(error)
                if self._stop.is_set():
                    return self._ended(cancelled=True)
                verdict = classify(
                    error, jvm_error=outcome.jvm_error, while_starting=outcome.while_starting
                )
                if not verdict.retriable:
                    raise self._final(error, f"not retriable: {verdict.reason}", False)
                if outcome.committed:
                    tolerated = 0
                if verdict.checkpoint_failure and tolerated < tolerable:
                    tolerated += 1
                    delay_ms = 0
                    why = f"failed checkpoint {tolerated} of {tolerable} tolerated in a row"
                else:
                    backoff.notify_failure(int(self._clock() * 1000))
                    if not backoff.can_restart():
                        raise self._final(error, backoff.exhausted_reason(), True)
                    delay_ms = backoff.get_backoff_time()
                    why = str(self._strategy)
                self.restarts += 1
                delay = delay_ms / 1000
                log.warning(
                    "streaming query %s failed: %s; restart %d in %.3f s (%s)",
                    _label(self._query),
                    summarize(error),
                    self.restarts,
                    delay,
                    why,
                )
                log.debug("the failure of streaming query %s", _label(self._query), exc_info=error)
                self._notify("on_restart", self.restarts, error, delay)
                if self._stop.wait(delay):
                    return self._ended(cancelled=True)
        except KeyboardInterrupt:
            self._interrupted()
            raise
        except Exception as error:
            if not _masks_interrupt(error):
                raise
            self._interrupted()
            raise KeyboardInterrupt from error

    def _interrupted(self) -> None:
        log.warning("KeyboardInterrupt: stopping streaming query %s", _label(self._query))
        self._stop_query()
        self._ended(cancelled=True)

    def _attempt(self) -> _Outcome:
        try:
            self._apply_session_settings()
            query = self._start(self._builder())
        except Exception as error:  # noqa: BLE001 - classified by the caller
            if _masks_interrupt(error):  # Ctrl-C while starting: not a failure to restart from
                raise KeyboardInterrupt from error
            return _Outcome(_End.FAILED, error=error, while_starting=True)
        self._query = query
        self._checkpoint = self._running.checkpoint or self._checkpoint
        log.info("started streaming query %s (attempt %d)", _label(query), self.restarts)
        self._notify("on_start", query, self.restarts)
        return self._watch(query)

    def _apply_session_settings(self) -> None:
        if self._config is None or self._config.get_num_retained_checkpoints() is None:
            return
        session = self._spark or SparkSession.getActiveSession()
        if session is None:
            raise ValueError(
                "CheckpointConfig.num_retained is a session setting and there is no active "
                "SparkSession: pass spark= to run()/Supervisor"
            )
        self._config.apply(session)

    def _start(self, built: Any) -> StreamingQuery:  # noqa: ANN401 - a writer or a query
        if is_instance(built, DataStreamWriter):
            query = (self._config.apply(built) if self._config else built).start()
            self._started(query)
            return query
        if not is_instance(built, StreamingQuery):
            raise TypeError(
                "query_builder must return a started StreamingQuery or a DataStreamWriter, got "
                f"{type(built).__name__}"
            )
        self._started(built)
        try:
            self._check_config_applied(built)
        except Exception:
            built.stop()
            raise
        return built

    def _started(self, query: StreamingQuery) -> None:
        """Reads what the supervisor needs of a query while it runs (on Connect, the server
        answers only about running queries)."""
        self._query = query  # stopped by an interrupt from here on
        if is_connect(query):
            self._connect_session = query._session
        self._running = _running_query(query)

    def _check_config_applied(self, query: StreamingQuery) -> None:
        """A query started by the builder must carry the config's trigger and location."""
        if self._config is None:
            return
        interval = self._config.get_checkpoint_interval()
        trigger = self._running.trigger
        if interval is not None and trigger is not None:
            if trigger != f"ProcessingTimeTrigger({interval})":
                raise ValueError(
                    f"CheckpointConfig sets the interval {interval} ms but query "
                    f"{_label(query)} was started with {trigger}: apply the config to the writer "
                    "(config.apply(df.writeStream...)) or return the DataStreamWriter from the "
                    "query builder"
                )
        storage = self._config.get_checkpoint_storage_dir()
        root = self._running.checkpoint
        if storage is not None and root is not None:
            expected = _qualified(storage, self._connect_session).rstrip("/")
            if root.rstrip("/") != expected:
                raise ValueError(
                    f"CheckpointConfig sets the checkpoint storage {expected} but query "
                    f"{_label(query)} uses {root}: apply the config to the writer or return the "
                    "DataStreamWriter from the query builder"
                )

    def _watch(self, query: StreamingQuery) -> _Outcome:
        watch = None
        if self._config is not None:
            watch = BatchWatch(
                query,
                self._config.get_checkpoint_timeout(),
                self._config.get_min_pause_between_checkpoints(),
                self._clock,
            )
        timed_out: CheckpointTimeoutError | None = None
        while True:
            if self._stop.is_set() and query.isActive:
                log.info("stopping streaming query %s (user stop)", _label(query))
                query.stop()
            try:
                done = query.awaitTermination(self._poll)
            except PySparkException as error:
                done = True  # it failed; the error is read below
                if is_connect(query):
                    # Also a lost server or session: only the query's own end says it ended.
                    try:
                        done = not query.isActive
                    except PySparkException:
                        return _Outcome(_End.FAILED, query, error)  # the server is unreachable
            if done or not query.isActive:
                return self._terminated(query, timed_out)
            if watch is not None and timed_out is None:
                timed_out = self._poll_watch(query, watch)

    def _poll_watch(
        self, query: StreamingQuery, watch: BatchWatch
    ) -> CheckpointTimeoutError | None:
        assert self._config is not None
        paused = watch.poll_pause()
        if paused is not None:
            batch_id, pause = paused
            log.warning(
                "batch %d of streaming query %s started %.3f s after the previous batch ended, "
                "less than the minimum pause of %d ms",
                batch_id,
                _label(query),
                pause,
                self._config.get_min_pause_between_checkpoints(),
            )
            self._notify("on_min_pause_violated", query, batch_id, pause)
        late = watch.poll_timeout()
        if late is None:
            return None
        timeout_ms = self._config.get_checkpoint_timeout()
        log.warning(
            "batch %s of streaming query %s has been running for %.1f s, past the checkpoint "
            "timeout of %d ms",
            late.batch_id,
            _label(query),
            late.elapsed,
            timeout_ms,
        )
        self._notify("on_checkpoint_timeout", query, late.batch_id, late.elapsed)
        if not self._config.is_fail_on_checkpoint_timeout():
            return None
        error = CheckpointTimeoutError(_label(query), late.batch_id, timeout_ms, late.elapsed)
        log.error("%s", error)
        # Stopping interrupts the batch before its commit; it is replayed on the next start.
        query.stop()
        return error

    def _terminated(self, query: StreamingQuery, timed_out: BaseException | None) -> _Outcome:
        committed = _committed_a_batch(query)
        if timed_out is not None:
            return _Outcome(_End.FAILED, query, timed_out, committed=committed)
        if is_connect(query):
            # The JVM's exception stays on the server: its condition and text came with it.
            error, jvm_error = query.exception(), None
        else:
            failure = query._jsq.exception()
            error = query.exception() if failure.isDefined() else None
            jvm_error = failure.get() if failure.isDefined() else None
        if error is not None:
            return _Outcome(_End.FAILED, query, error, jvm_error, committed=committed)
        if self._stop.is_set():
            return _Outcome(_End.CANCELLED, query)
        # Ended without error and without stop(): a one-shot trigger finished, or the user called
        # query.stop() on a repeating one.
        trigger = self._running.trigger or "OneTimeTrigger"  # unknown: assume finished (keep)
        one_shot = "AvailableNow" in trigger or "OneTime" in trigger
        return _Outcome(_End.FINISHED if one_shot else _End.CANCELLED, query)

    # -- endings ------------------------------------------------------------------------------

    def _ended(self, cancelled: bool) -> StreamingQuery | None:
        query = self._query
        how = "stopped by the user" if cancelled else "finished"
        log.info("streaming query %s %s", _label(query), how)
        if (
            cancelled
            and self._config is not None
            and (
                self._config.get_externalized_checkpoint_cleanup()
                is ExternalizedCheckpointCleanup.DELETE_ON_CANCELLATION
            )
        ):
            self._delete_checkpoint()
        self._notify("on_terminated", query, cancelled)
        return query

    def _delete_checkpoint(self) -> None:
        # Only the checkpoint of a query this run started: a stop before any start deletes
        # nothing, whatever the config names.
        location = self._checkpoint
        if location is None:
            what = "no query was started" if self._query is None else "its checkpoint is unknown"
            log.warning("DELETE_ON_CANCELLATION: %s; no checkpoint deleted", what)
            return
        if self._connect_session is not None:
            _on_server(self._connect_session, "checkpoint.delete", location)
        else:
            fs, path = _hadoop_path(location)
            if fs.exists(path) and not fs.delete(path, True):
                raise RuntimeError(
                    f"DELETE_ON_CANCELLATION: could not delete checkpoint {location}"
                )
        log.info("deleted checkpoint %s (DELETE_ON_CANCELLATION)", location)

    def _final(self, error: BaseException, reason: str, retriable: bool) -> QueryFailedError:
        label = _label(self._query)
        failure = QueryFailedError(
            f"streaming query {label} failed after {self.restarts} restart(s) and is not "
            f"restarted: {reason}. Last failure: {summarize(error)}",
            error,
            self.restarts,
            retriable,
        )
        failure.__cause__ = error
        log.error("%s", failure)
        self._notify("on_failure", failure)
        return failure

    def _stop_query(self) -> None:
        query = self._query
        try:
            if query is not None and query.isActive:
                query.stop()
        except Exception:  # noqa: BLE001 - stopping on the way out; the interrupt matters more
            log.exception("could not stop streaming query %s", _label(query))

    def _notify(self, name: str, *args: object) -> None:
        method = getattr(self._listener, name, None) if self._listener is not None else None
        if method is None:
            return
        try:
            method(*args)
        except Exception:  # noqa: BLE001 - a listener must not change the query's fate
            log.exception("listener %r raised in %s; ignored", self._listener, name)


def run(
    query_builder: QueryBuilder,
    restart_strategy: RestartStrategy | None = None,
    listener: SupervisorListener | None = None,
    checkpoint_config: CheckpointConfig | None = None,
    *,
    spark: SparkSession | None = None,
    poll_interval: float = 0.1,
) -> StreamingQuery | None:
    """Run a streaming query under a restart strategy (Flink's default, exponential delay, when
    none is given); see ``Supervisor``."""
    return Supervisor(
        query_builder,
        restart_strategy,
        listener,
        checkpoint_config,
        spark=spark,
        poll_interval=poll_interval,
    ).run()
