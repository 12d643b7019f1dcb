"""keyedstate.CheckpointConfig: Flink's checkpoint settings on a Spark query (docs/exactly-once.md,
"Checkpoint settings"): values checked before the start, the trigger and location applied, the
timeout reported or failing the query cleanly, tolerable failed checkpoints, the cleanup on
cancel and the minimum pause reported."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate.runtime.checkpoint_config import MIN_BATCHES_TO_RETAIN_KEY
from pyspark.sql import SparkSession

from tests.support.streaming_harness import committed_batches
from tests.support.supervisor_support import (
    FILES,
    POLL,
    FlakySink,
    RecordingListener,
    fails_naming,
    input_files,
    reference_batches,
    stop_when,
    writer,
)

Cleanup = keyedstate.ExternalizedCheckpointCleanup
# Longer than any batch of these tests takes unless stalled on purpose; a stalled batch waits
# (at most STALL_S) until the listener hears of its timeout.
TIMEOUT_MS = 2500
STALL_S = 20.0


def test_defaults_are_flinks_and_setters_match_keywords() -> None:
    config = keyedstate.CheckpointConfig()
    assert config.get_checkpoint_interval() is None
    assert config.get_min_pause_between_checkpoints() == 0
    assert config.get_checkpoint_timeout() == 600_000
    assert not config.is_fail_on_checkpoint_timeout()
    assert config.get_num_retained_checkpoints() is None
    assert config.get_tolerable_checkpoint_failure_number() == 0
    assert config.get_externalized_checkpoint_cleanup() is Cleanup.RETAIN_ON_CANCELLATION
    by_keywords = keyedstate.CheckpointConfig(
        interval=dt.timedelta(seconds=2), min_pause=keyedstate.Duration.of_millis(500),
        timeout=30_000, fail_on_timeout=True, num_retained=5, tolerable_failed_checkpoints=2,
        cleanup=Cleanup.DELETE_ON_CANCELLATION, checkpoint_storage="/tmp/ck",
    )
    by_setters = (
        keyedstate.CheckpointConfig()
        .set_checkpoint_interval(2000)
        .set_min_pause_between_checkpoints(500)
        .set_checkpoint_timeout(dt.timedelta(seconds=30))
        .set_fail_on_checkpoint_timeout(True)
        .set_num_retained_checkpoints(5)
        .set_tolerable_checkpoint_failure_number(2)
        .enable_externalized_checkpoints(Cleanup.DELETE_ON_CANCELLATION)
        .set_checkpoint_storage_dir("/tmp/ck")
    )
    assert repr(by_keywords) == repr(by_setters)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: keyedstate.CheckpointConfig(interval=0), ValueError,
         ["interval", "0", "at least 1 ms"]),
        (lambda: keyedstate.CheckpointConfig(interval="1s"), TypeError,
         ["interval", "'1s'", "timedelta"]),
        (lambda: keyedstate.CheckpointConfig(min_pause=-1), ValueError,
         ["min_pause", "-1", "at least 0 ms"]),
        (lambda: keyedstate.CheckpointConfig(timeout=0), ValueError,
         ["timeout", "at least 1 ms"]),
        (lambda: keyedstate.CheckpointConfig(timeout=2.5), TypeError, ["timeout", "2.5"]),
        (lambda: keyedstate.CheckpointConfig(fail_on_timeout="yes"), TypeError,
         ["fail_on_timeout", "'yes'", "True or False"]),
        (lambda: keyedstate.CheckpointConfig(num_retained=0), ValueError,
         ["num_retained", "0", "at least 1"]),
        (lambda: keyedstate.CheckpointConfig(num_retained=True), TypeError,
         ["num_retained", "True"]),
        (lambda: keyedstate.CheckpointConfig(tolerable_failed_checkpoints=-1), ValueError,
         ["tolerable_failed_checkpoints", "-1", "at least 0"]),
        (lambda: keyedstate.CheckpointConfig(tolerable_failed_checkpoints=1.0), TypeError,
         ["tolerable_failed_checkpoints", "1.0"]),
        (lambda: keyedstate.CheckpointConfig(cleanup="DELETE_ON_CANCELLATION"), TypeError,
         ["cleanup", "ExternalizedCheckpointCleanup.DELETE_ON_CANCELLATION",
          "'DELETE_ON_CANCELLATION'"]),
        (lambda: keyedstate.CheckpointConfig(checkpoint_storage=" "), ValueError,
         ["checkpoint_storage", "' '"]),
        (lambda: keyedstate.CheckpointConfig(checkpoint_storage=Path("/x")), TypeError,
         ["checkpoint_storage", "PosixPath"]),
        (lambda: keyedstate.CheckpointConfig(interval=1000, min_pause=1000).validate(),
         ValueError, ["min_pause (1000 ms) must be shorter than the interval (1000 ms)"]),
        (lambda: keyedstate.CheckpointConfig(min_pause=100).validate(), ValueError,
         ["min_pause (100 ms) needs an interval"]),
        (lambda: keyedstate.CheckpointConfig().apply("session"), TypeError,
         ["SparkSession.Builder", "DataStreamWriter", "str"]),
    ],
)
def test_invalid_settings_fail_naming_the_setting_value_and_rule(
    make: Callable[[], object], error: type[Exception], words: list[str]
) -> None:
    fails_naming(make, error, words)


def test_apply_to_a_builder_sets_the_retained_batches() -> None:
    builder = keyedstate.CheckpointConfig(num_retained=7).apply(SparkSession.builder)
    try:
        assert builder._options[MIN_BATCHES_TO_RETAIN_KEY] == "7"
    finally:
        builder._options.pop(MIN_BATCHES_TO_RETAIN_KEY)  # the builder is a process-wide singleton


# ---------------------------------------------------------------------------------------------
# Real queries (the ``clean`` session: tests/runtime/conftest.py)


def test_run_applies_trigger_location_and_retained_batches(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in")
    checkpoint = tmp_path / "ck"
    config = keyedstate.CheckpointConfig(
        interval=150, num_retained=3, checkpoint_storage=str(checkpoint)
    )
    sink = FlakySink()
    # The builder returns the writer: the supervisor applies the config and starts it.
    supervisor = keyedstate.Supervisor(
        lambda: writer(spark, source, None, sink), keyedstate.no_restart(),
        checkpoint_config=config, spark=spark, poll_interval=POLL,
    )
    # A stop interrupts the running batch (Spark's stop): batch 2 may or may not commit.
    stop_when(supervisor, lambda: max(sink.collector.batches, default=-1) >= 2)
    query = supervisor.run()
    assert query is not None
    # As the running query reported it (from the server on Spark Connect).
    assert supervisor._running.trigger == "ProcessingTimeTrigger(150)"
    assert committed_batches(checkpoint)[:2] == [0, 1]  # kept: RETAIN_ON_CANCELLATION
    assert spark.conf.get(MIN_BATCHES_TO_RETAIN_KEY) == "3"


def test_a_query_started_without_the_config_is_refused(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    config = keyedstate.CheckpointConfig(interval=150)
    listener = RecordingListener()
    with pytest.raises(keyedstate.QueryFailedError) as failure:
        keyedstate.run(
            lambda: writer(spark, source, tmp_path / "ck", FlakySink())
            .trigger(processingTime="1 second").start(),
            keyedstate.fixed_delay_restart(3, 0), listener, config, poll_interval=POLL,
        )
    assert listener.kinds() == ["failure"] and not failure.value.retriable
    assert "interval 150 ms" in str(failure.value)
    assert "ProcessingTimeTrigger(1000)" in str(failure.value)
    assert not spark.streams.active


@pytest.mark.classic_only("a stalled batch is released by the listener, in the test's own process")
def test_a_batch_past_the_timeout_is_reported_and_the_query_goes_on(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:2])
    sink = FlakySink(stall={2}, stall_s=STALL_S)
    listener = RecordingListener(sink.release)
    keyedstate.run(
        lambda: writer(spark, source, tmp_path / "ck", sink).trigger(availableNow=True).start(),
        keyedstate.no_restart(), listener, keyedstate.CheckpointConfig(timeout=TIMEOUT_MS),
        poll_interval=POLL,
    )
    # (On a loaded machine another batch may be reported as well.)
    assert listener.kinds()[0] == "start" and listener.events[-1] == ("terminated", False)
    assert set(listener.kinds()[1:-1]) == {"timeout"}
    timeouts = {e[1]: e[2] for e in listener.events if e[0] == "timeout"}
    assert 1 in timeouts and timeouts[1] > TIMEOUT_MS / 1000
    assert sorted(sink.collector.batches) == [0, 1]


@pytest.mark.classic_only("a stalled batch is released by the listener, in the test's own process")
def test_fail_on_timeout_stops_the_query_cleanly_naming_the_batch(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    checkpoint = tmp_path / "ck"
    sink = FlakySink(stall={1}, stall_s=STALL_S)  # call 1 = batch 0
    listener = RecordingListener(sink.release)
    config = keyedstate.CheckpointConfig(timeout=TIMEOUT_MS, fail_on_timeout=True)
    with pytest.raises(keyedstate.QueryFailedError) as failure:
        keyedstate.run(
            lambda: writer(spark, source, checkpoint, sink).trigger(availableNow=True).start(),
            keyedstate.no_restart(), listener, config, poll_interval=POLL,
        )
    cause = failure.value.cause
    assert isinstance(cause, keyedstate.CheckpointTimeoutError)
    assert cause.batch_id == 0 and cause.timeout_ms == TIMEOUT_MS
    assert "batch 0 of query" in str(failure.value)
    assert f"timeout of {TIMEOUT_MS} ms" in str(failure.value)
    assert listener.kinds() == ["start", "timeout", "failure"]
    assert not spark.streams.active
    assert committed_batches(checkpoint) == []  # batch 0 stopped before its commit
    assert sink.calls == 1


@pytest.mark.classic_only("a stalled batch is released by the listener, in the test's own process")
@pytest.mark.parametrize(("stalls", "finishes"), [({1}, True), ({1, 2}, False)])
def test_tolerable_failed_checkpoints_restart_without_the_strategy(
    clean: SparkSession, tmp_path: Path, stalls: set[int], finishes: bool
) -> None:
    spark = clean
    expected = reference_batches(spark, tmp_path) if finishes else None
    source = input_files(tmp_path / "in")
    sink = FlakySink(stall=stalls, stall_s=STALL_S)
    listener = RecordingListener(sink.release)
    config = keyedstate.CheckpointConfig(
        timeout=TIMEOUT_MS, fail_on_timeout=True, tolerable_failed_checkpoints=1
    )

    def go() -> Any:  # noqa: ANN401
        return keyedstate.run(
            lambda: writer(spark, source, tmp_path / "ck", sink).trigger(availableNow=True).start(),
            keyedstate.no_restart(), listener, config, poll_interval=POLL,
        )

    if finishes:
        go()
        assert sink.collector.batches == expected
        assert listener.kinds() == ["start", "timeout", "restart", "start", "terminated"]
        restart = listener.events[2]
        assert isinstance(restart[2], keyedstate.CheckpointTimeoutError) and restart[3] == 0.0
    else:  # two in a row without a commit between: the second goes to no_restart()
        with pytest.raises(keyedstate.QueryFailedError) as failure:
            go()
        assert listener.kinds() == [
            "start", "timeout", "restart", "start", "timeout", "failure",
        ]
        assert "no_restart()" in str(failure.value)


@pytest.mark.parametrize(
    ("cleanup", "trigger", "kept"),
    [
        (Cleanup.RETAIN_ON_CANCELLATION, "repeating", True),
        (Cleanup.DELETE_ON_CANCELLATION, "repeating", False),
        # An availableNow query that finishes was not cancelled: its checkpoint is kept.
        (Cleanup.DELETE_ON_CANCELLATION, "availableNow", True),
    ],
)
def test_cleanup_on_cancel_retains_or_deletes_the_checkpoint(
    clean: SparkSession, tmp_path: Path, cleanup: keyedstate.ExternalizedCheckpointCleanup,
    trigger: str, kept: bool,
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:1])
    checkpoint = tmp_path / "ck"
    sink = FlakySink()
    listener = RecordingListener()
    if trigger == "repeating":
        config = keyedstate.CheckpointConfig(
            interval=100, cleanup=cleanup, checkpoint_storage=str(checkpoint)
        )
        build = lambda: writer(spark, source, None, sink)  # noqa: E731
    else:
        config = keyedstate.CheckpointConfig(cleanup=cleanup)
        build = lambda: writer(  # noqa: E731
            spark, source, checkpoint, FlakySink()
        ).trigger(availableNow=True)
    supervisor = keyedstate.Supervisor(
        build, keyedstate.no_restart(), listener, config, poll_interval=POLL
    )
    if trigger == "repeating":
        stop_when(supervisor, lambda: sink.calls > 0)
    supervisor.run()
    assert listener.events[-1] == ("terminated", trigger == "repeating")
    # (A stop interrupts the running batch, so whether batch 0 committed is not asserted.)
    assert (checkpoint / "metadata").exists() == kept and checkpoint.exists() == kept


def test_a_batch_starting_sooner_than_the_min_pause_is_reported(
    clean: SparkSession, tmp_path: Path
) -> None:
    spark = clean
    source = input_files(tmp_path / "in", FILES[:3])
    supervisor: keyedstate.Supervisor
    # Every batch overruns the 300 ms interval, so the next one starts at once; each stays long
    # enough for a poll to see every progress.
    slow = FlakySink(stall={1, 2, 3}, stall_s=0.5)

    class StopOnPause(RecordingListener):
        def on_min_pause_violated(self, query: Any, batch_id: int, pause: float) -> None:  # noqa: ANN401
            super().on_min_pause_violated(query, batch_id, pause)
            supervisor.stop()

    listener = StopOnPause()
    config = keyedstate.CheckpointConfig(interval=300, min_pause=200)
    supervisor = keyedstate.Supervisor(
        lambda: config.apply(writer(spark, source, tmp_path / "ck", slow)).start(),
        keyedstate.no_restart(), listener, config, poll_interval=POLL,
    )
    supervisor.run()
    pauses = [e for e in listener.events if e[0] == "pause"]
    assert pauses and pauses[0][1] == 1 and pauses[0][2] < 0.2, listener.events
    assert listener.events[-1] == ("terminated", True)
