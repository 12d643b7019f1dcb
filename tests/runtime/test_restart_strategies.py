"""Restart strategies (Flink's, docs/exactly-once.md "Restart strategies") and the supervisor
that applies them to a Spark streaming query: restarts from the checkpoint are exactly once,
exhausted strategies and non-retriable failures end the run, user stops end it quietly."""

from __future__ import annotations

import _thread
import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate.runtime.failures import classify
from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.support.streaming_harness import committed_batches
from tests.support.supervisor_support import (
    FILES,
    POLL,
    FlakySink,
    RecordingListener,
    fails_naming,
    input_files,
    reference_batches,
    writer,
)

# ---------------------------------------------------------------------------------------------
# The strategies' decisions, driven by an explicit clock (milliseconds)


def decisions(strategy: keyedstate.RestartStrategy, failures_at: list[int]) -> list[Any]:
    """For each failure time: the backoff in ms if a restart is allowed, else None."""
    backoff = strategy.new_backoff(random.Random(7))
    out: list[Any] = []
    for now in failures_at:
        backoff.notify_failure(now)
        out.append(backoff.get_backoff_time() if backoff.can_restart() else None)
    return out


def test_fixed_delay_allows_exactly_its_attempts() -> None:
    strategy = keyedstate.fixed_delay_restart(3, dt.timedelta(milliseconds=250))
    assert decisions(strategy, [0, 10, 20, 30]) == [250, 250, 250, None]
    assert decisions(keyedstate.fixed_delay_restart(0, 0), [0]) == [None]
    assert str(strategy) == "fixed_delay_restart(attempts=3, delay=250 ms)"


def test_failure_rate_fails_when_the_maximum_falls_within_one_interval() -> None:
    strategy = keyedstate.failure_rate_restart(3, 1000, 50)
    # Three failures within 1000 ms: the third is final.
    assert decisions(strategy, [0, 400, 1000]) == [50, 50, None]
    # The window slides: only the newest three failures count, and they must span > 1000 ms.
    assert decisions(strategy, [0, 600, 1200, 1800, 2400]) == [50, 50, 50, 50, 50]
    assert decisions(strategy, [0, 600, 1200, 1300]) == [50, 50, 50, None]
    # Exactly the interval apart is still within it (Flink: "more than the interval" to go on).
    assert decisions(strategy, [0, 500, 1000]) == [50, 50, None]
    assert decisions(strategy, [0, 500, 1001]) == [50, 50, 50]
    assert decisions(keyedstate.failure_rate_restart(1, 10, 0), [0]) == [None]
    backoff = strategy.new_backoff()
    for t in (0, 1, 2):
        backoff.notify_failure(t)
    assert "3 failures within 2 ms (the limit is 3 per 1000 ms)" in backoff.exhausted_reason()


def test_exponential_delay_grows_caps_and_resets_after_a_quiet_period() -> None:
    strategy = keyedstate.exponential_delay_restart(
        dt.timedelta(milliseconds=100), dt.timedelta(milliseconds=1000), 2.0,
        dt.timedelta(seconds=10), 0.0,
    )
    # Growth: 100, 200, 400, 800, then capped at 1000.
    assert decisions(strategy, [0, 1, 2, 3, 4, 5]) == [100, 200, 400, 800, 1000, 1000]
    # A failure more than reset threshold + current backoff after the previous one resets it;
    # one just inside keeps growing.
    assert decisions(strategy, [0, 1, 1 + 10_000 + 200]) == [100, 200, 100]
    assert decisions(strategy, [0, 1, 1 + 10_000 + 199]) == [100, 200, 400]
    # Never exhausted.
    assert all(d is not None for d in decisions(strategy, list(range(50))))


def test_exponential_delay_jitter_stays_within_its_factor_and_the_maximum() -> None:
    strategy = keyedstate.exponential_delay_restart(1000, 4000, 2, 3_600_000, 0.25)
    backoff = strategy.new_backoff(random.Random(1))
    seen = []
    for now in range(8):
        backoff.notify_failure(now)
        base = min(1000 * 2**now, 4000)
        delay = backoff.get_backoff_time()
        assert base - base // 4 <= delay <= min(base + base // 4, 4000), (now, delay)
        seen.append(delay)
    assert len(set(seen)) > 2  # the jitter varies


def test_no_restart_and_the_pyflink_spelling() -> None:
    assert decisions(keyedstate.no_restart(), [0]) == [None]
    assert keyedstate.RestartStrategies.fixed_delay_restart(2, 10) == (
        keyedstate.fixed_delay_restart(2, keyedstate.Time.milliseconds(10))
    )
    assert keyedstate.RestartStrategies.failure_rate_restart(
        2, keyedstate.Duration.of_seconds(1), 0
    ) == keyedstate.failure_rate_restart(2, dt.timedelta(seconds=1), 0)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: keyedstate.fixed_delay_restart(-1, 0), ValueError,
         ["fixed_delay_restart", "attempts", "-1", "at least 0"]),
        (lambda: keyedstate.fixed_delay_restart(2.0, 0), TypeError, ["attempts", "2.0", "int"]),
        (lambda: keyedstate.fixed_delay_restart(True, 0), TypeError, ["attempts", "True"]),
        (lambda: keyedstate.fixed_delay_restart(1, -5), ValueError,
         ["delay", "-5", "at least 0 ms"]),
        (lambda: keyedstate.fixed_delay_restart(1, 1.5), TypeError,
         ["delay", "1.5", "timedelta", "milliseconds"]),
        (lambda: keyedstate.fixed_delay_restart(1, dt.timedelta(microseconds=1500)), ValueError,
         ["delay", "whole milliseconds"]),
        (lambda: keyedstate.failure_rate_restart(0, 1000, 0), ValueError,
         ["failure_rate_restart", "max_failures_per_interval", "0", "at least 1"]),
        (lambda: keyedstate.failure_rate_restart(1, 0, 0), ValueError,
         ["interval", "at least 1 ms"]),
        (lambda: keyedstate.failure_rate_restart(1, "1s", 0), TypeError, ["interval", "'1s'"]),
        (lambda: keyedstate.failure_rate_restart(1, 10, -1), ValueError, ["delay", "-1"]),
        (lambda: keyedstate.exponential_delay_restart(0, 10, 2, 10, 0), ValueError,
         ["exponential_delay_restart", "initial_backoff", "at least 1 ms"]),
        (lambda: keyedstate.exponential_delay_restart(10, 0, 2, 10, 0), ValueError,
         ["max_backoff", "at least 1 ms"]),
        (lambda: keyedstate.exponential_delay_restart(20, 10, 2, 10, 0), ValueError,
         ["initial_backoff must not exceed max_backoff", "20 ms", "10 ms"]),
        (lambda: keyedstate.exponential_delay_restart(1, 10, 1.0, 10, 0), ValueError,
         ["backoff_multiplier", "above 1", "1.0"]),
        (lambda: keyedstate.exponential_delay_restart(1, 10, float("inf"), 10, 0), ValueError,
         ["backoff_multiplier", "inf"]),
        (lambda: keyedstate.exponential_delay_restart(1, 10, "2", 10, 0), TypeError,
         ["backoff_multiplier", "'2'"]),
        (lambda: keyedstate.exponential_delay_restart(1, 10, 2, 0, 0), ValueError,
         ["reset_backoff_threshold", "at least 1 ms"]),
        (lambda: keyedstate.exponential_delay_restart(1, 10, 2, 10, 1.5), ValueError,
         ["jitter_factor", "1.5", "from 0 to 1"]),
        (lambda: keyedstate.exponential_delay_restart(1, 10, 2, 10, -0.1), ValueError,
         ["jitter_factor", "-0.1"]),
        (lambda: keyedstate.Supervisor("not callable"), TypeError,
         ["query_builder", "callable", "'not callable'"]),
        (lambda: keyedstate.Supervisor(lambda: None, restart_strategy=3), TypeError,
         ["restart_strategy", "fixed_delay_restart", "3"]),
        (lambda: keyedstate.Supervisor(lambda: None, listener=object()), TypeError,
         ["listener", "SupervisorListener", "on_restart"]),
        (lambda: keyedstate.Supervisor(lambda: None, checkpoint_config={}), TypeError,
         ["checkpoint_config", "CheckpointConfig", "{}"]),
        (lambda: keyedstate.Supervisor(lambda: None, spark="local"), TypeError,
         ["spark", "SparkSession", "'local'"]),
        (lambda: keyedstate.Supervisor(lambda: None, poll_interval=0), ValueError,
         ["poll_interval", "0", "above 0"]),
        (lambda: keyedstate.Supervisor(
            lambda: None, checkpoint_config=keyedstate.CheckpointConfig(interval=100, min_pause=100)
        ), ValueError, ["min_pause (100 ms)", "interval (100 ms)"]),
    ],
)
def test_invalid_arguments_fail_naming_the_argument_value_and_rule(
    make: Callable[[], object], error: type[Exception], words: list[str]
) -> None:
    fails_naming(make, error, words)


# ---------------------------------------------------------------------------------------------
# Classification and the loop, without a query (the builder fails before starting one)


def test_classification_of_python_errors() -> None:
    assert classify(RuntimeError("flaky")).retriable
    assert classify(ValueError("bad row")).retriable  # a failure while running: user code
    assert not classify(ValueError("bad option"), while_starting=True).retriable
    assert not classify(TypeError("bad argument"), while_starting=True).retriable
    assert not classify(AnalysisException("no such column")).retriable
    suppressed = keyedstate.SuppressRestartsException("wrong credentials")
    assert not classify(suppressed).retriable
    try:
        try:
            raise ConnectionError("refused")
        except ConnectionError as inner:
            raise keyedstate.SuppressRestartsException("give up") from inner
    except keyedstate.SuppressRestartsException as chained:
        assert not classify(chained).retriable
    timeout = keyedstate.CheckpointTimeoutError("q", 3, 100, 0.5)
    verdict = classify(timeout)
    assert verdict.retriable and verdict.checkpoint_failure


def test_restarts_until_the_attempts_are_used_then_reports_the_final_failure_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = []

    def build() -> Any:  # noqa: ANN401
        calls.append(1)
        raise ConnectionRefusedError(f"server down (call {len(calls)})")

    listener = RecordingListener()
    caplog.set_level(logging.INFO, logger="keyedstate.runtime")
    with pytest.raises(keyedstate.QueryFailedError) as failure:
        keyedstate.run(build, keyedstate.fixed_delay_restart(2, 1), listener)
    assert len(calls) == 3
    assert listener.kinds() == ["restart", "restart", "failure"]
    assert [e[1] for e in listener.events[:2]] == [1, 2]
    assert all(e[3] == 0.001 for e in listener.events[:2])
    final = failure.value
    assert listener.events[2][1] is final
    assert final.__cause__ is final.cause and "call 3" in str(final.cause)
    assert final.restarts == 2 and final.retriable
    assert "used all 2 restart attempt(s)" in str(final)
    assert "ConnectionRefusedError: server down (call 3)" in str(final)
    restarts = [r for r in caplog.records if r.levelname == "WARNING" and "restart " in r.message]
    assert len(restarts) == 2 and "server down (call 1)" in restarts[0].getMessage()
    assert any(r.levelname == "ERROR" and "call 3" in r.getMessage() for r in caplog.records)


def test_a_bad_setting_in_the_builder_is_not_retried() -> None:
    calls = []

    def build() -> Any:  # noqa: ANN401
        calls.append(1)
        return keyedstate.configure(SparkSession.builder, compression="bogus")

    listener = RecordingListener()
    with pytest.raises(keyedstate.QueryFailedError) as failure:
        keyedstate.run(build, keyedstate.fixed_delay_restart(5, 0), listener)
    assert len(calls) == 1 and listener.kinds() == ["failure"]
    assert not failure.value.retriable
    assert "not retriable" in str(failure.value) and "'bogus'" in str(failure.value)


def test_a_listener_that_raises_is_logged_and_does_not_change_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(keyedstate.SupervisorListener):
        def on_restart(self, attempt: int, cause: BaseException, delay: float) -> None:
            raise RuntimeError("listener bug")

    def build() -> Any:  # noqa: ANN401
        raise OSError("disk full")

    with pytest.raises(keyedstate.QueryFailedError):
        keyedstate.run(build, keyedstate.fixed_delay_restart(1, 0), Broken())
    assert any("listener bug" in (r.exc_text or "") or "on_restart" in r.getMessage()
               for r in caplog.records)


def test_a_stop_before_the_start_starts_nothing_and_a_supervisor_runs_once() -> None:
    calls = []
    listener = RecordingListener()
    supervisor = keyedstate.Supervisor(lambda: calls.append(1), keyedstate.no_restart(), listener)
    supervisor.stop()
    assert supervisor.run() is None
    assert calls == [] and listener.events == [("terminated", True)]
    with pytest.raises(RuntimeError, match="runs once"):
        supervisor.run()


# ---------------------------------------------------------------------------------------------
# Real queries (the ``clean`` session: tests/runtime/conftest.py)


def test_failed_batches_are_restarted_from_the_checkpoint_exactly_once(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    expected = reference_batches(spark, tmp_path)
    source = input_files(tmp_path / "in")
    checkpoint = tmp_path / "ck"
    # Call 1 (batch 0) and call 3 (batch 1, second attempt's second call) fail after their
    # output and state were written; call 5 (batch 2) as well.
    sink = FlakySink(fail={1, 3, 5})
    listener = RecordingListener()

    def build() -> Any:  # noqa: ANN401
        return writer(spark, source, checkpoint, sink).trigger(availableNow=True).start()

    last = keyedstate.run(
        build, keyedstate.fixed_delay_restart(3, 10), listener, poll_interval=POLL
    )
    assert last is not None and not last.isActive
    assert sink.collector.batches == expected
    assert committed_batches(checkpoint) == [0, 1, 2]
    assert listener.kinds() == [
        "start", "restart", "start", "restart", "start", "restart", "start", "terminated",
    ]
    assert [e[1] for e in listener.events if e[0] in ("start", "restart")] == [0, 1, 1, 2, 2, 3, 3]
    causes = [e[2] for e in listener.events if e[0] == "restart"]
    assert ["call 1 (batch 0)" in str(causes[0]), "call 3 (batch 1)" in str(causes[1])] == [
        True, True,
    ]
    assert listener.events[-1] == ("terminated", False)


def test_exhausted_attempts_end_with_the_cause(
    clean: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    sink = FlakySink(fail=range(1, 100))
    listener = RecordingListener()

    def build() -> Any:  # noqa: ANN401
        return writer(spark, source, tmp_path / "ck", sink).trigger(availableNow=True).start()

    caplog.set_level(logging.WARNING, logger="keyedstate.runtime")
    with pytest.raises(keyedstate.QueryFailedError) as failure:
        keyedstate.run(build, keyedstate.fixed_delay_restart(1, 10), listener, poll_interval=POLL)
    assert sink.calls == 2
    assert listener.kinds() == ["start", "restart", "start", "failure"]
    message = str(failure.value)
    assert "used all 1 restart attempt(s)" in message
    assert "RuntimeError: injected failure on call 2 (batch 0)" in message
    assert any("injected failure on call 1" in r.getMessage() for r in caplog.records)
    assert committed_batches(tmp_path / "ck") == []


def test_a_bad_keyedstate_option_is_not_retried(clean: SparkSession, tmp_path: Path) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    key = keyedstate.OPTION_PREFIX + "compression"
    listener = RecordingListener()
    starts = []

    def build() -> Any:  # noqa: ANN401
        starts.append(1)
        return writer(spark, source, tmp_path / "ck", FlakySink()).start()

    spark.conf.set(key, "bogus")
    try:
        with pytest.raises(keyedstate.QueryFailedError) as failure:
            keyedstate.run(build, keyedstate.fixed_delay_restart(5, 0), listener)
    finally:
        spark.conf.unset(key)
    assert len(starts) == 1 and listener.kinds() == ["failure"]
    message = str(failure.value)
    assert "not retriable" in message and "IllegalArgumentException" in message
    assert f"Invalid value 'bogus' for {key}" in message


def test_an_incompatible_state_schema_is_not_retried(clean: SparkSession, tmp_path: Path) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    checkpoint = tmp_path / "ck"
    keyedstate.run(
        lambda: writer(spark, source, checkpoint, FlakySink()).trigger(availableNow=True).start(),
        keyedstate.no_restart(), poll_interval=POLL,
    )
    source.add(FILES[1])
    listener = RecordingListener()

    def changed() -> Any:  # noqa: ANN401 - the same checkpoint, another aggregation
        return (
            source.read_stream(spark).groupBy("k").agg(F.avg("v")).writeStream
            .outputMode("update").foreachBatch(FlakySink())
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )

    with pytest.raises(keyedstate.QueryFailedError) as failure:
        keyedstate.run(changed, keyedstate.fixed_delay_restart(5, 0), listener, poll_interval=POLL)
    assert listener.kinds() == ["start", "failure"]
    assert "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in str(failure.value)
    assert "not retriable" in str(failure.value)


def test_suppress_restarts_exception_in_foreach_batch_is_not_retried(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    sink = FlakySink(fail={1}, error=lambda call, batch: keyedstate.SuppressRestartsException(
        "table events has the wrong schema"
    ))
    listener = RecordingListener()
    with pytest.raises(keyedstate.QueryFailedError) as failure:
        keyedstate.run(
            lambda: writer(spark, source, tmp_path / "ck", sink).trigger(availableNow=True).start(),
            keyedstate.fixed_delay_restart(5, 0), listener, poll_interval=POLL,
        )
    assert sink.calls == 1 and listener.kinds() == ["start", "failure"]
    assert "SuppressRestartsException" in str(failure.value)
    assert "wrong schema" in str(failure.value)


def test_a_user_stop_of_the_query_ends_the_run_without_restart(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    sink = FlakySink()
    listener = RecordingListener()
    supervisor = keyedstate.Supervisor(
        lambda: writer(spark, source, tmp_path / "ck", sink)
        .trigger(processingTime="100 milliseconds").start(),
        keyedstate.fixed_delay_restart(5, 0), listener, poll_interval=POLL,
    )

    def stop_the_query() -> None:  # as a user would, from another thread, after a batch
        deadline = time.monotonic() + 60
        while (sink.calls == 0 or supervisor.query is None) and time.monotonic() < deadline:
            time.sleep(0.05)
        query = supervisor.query
        assert query is not None
        query.stop()

    stopper = threading.Thread(target=stop_the_query)
    stopper.start()
    last = supervisor.run()
    stopper.join()
    assert last is not None and not last.isActive and last.exception() is None
    assert listener.kinds() == ["start", "terminated"] and listener.events[-1] == (
        "terminated", True,
    )
    assert supervisor.restarts == 0


@pytest.mark.classic_only("py4j's own error; no query")
def test_an_interrupt_py4j_masks_is_still_an_interrupt(clean: SparkSession) -> None:
    """Ctrl-C during a JVM call can reach the caller as py4j's own error, with the interrupt as
    its context (py4j fails to shut the interrupted connection down): the supervisor stops as
    for the interrupt, and does not count it as a failure to restart from."""
    calls = []

    def build() -> Any:  # noqa: ANN401
        calls.append(1)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            # As py4j raises it: implicitly chained to the interrupt.
            raise Py4JError("Gateway must be connected to send cancel cmd.")  # noqa: B904

    listener = RecordingListener()
    supervisor = keyedstate.Supervisor(build, keyedstate.fixed_delay_restart(5, 0), listener)
    with pytest.raises(KeyboardInterrupt) as interrupted:
        supervisor.run()
    assert isinstance(interrupted.value.__cause__, Py4JError)
    assert calls == [1] and supervisor.restarts == 0 and not supervisor.failures
    assert listener.kinds() == ["terminated"]


@pytest.mark.classic_only("the foreachBatch function interrupts the test's own main thread")
def test_keyboard_interrupt_stops_the_query_and_propagates(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    # The sink runs on py4j's callback thread; the interrupt lands in the supervisor's thread.
    sink = FlakySink(after=lambda call, batch: _thread.interrupt_main())
    listener = RecordingListener()
    supervisor = keyedstate.Supervisor(
        lambda: writer(spark, source, tmp_path / "ck", sink)
        .trigger(processingTime="100 milliseconds").start(),
        keyedstate.fixed_delay_restart(5, 0), listener, poll_interval=POLL,
    )
    with pytest.raises(KeyboardInterrupt):
        supervisor.run()
    query = supervisor.query
    assert query is not None and not query.isActive
    assert listener.kinds() == ["start", "terminated"] and supervisor.restarts == 0
    assert listener.events[-1] == ("terminated", True)
