"""A Spark Connect server SIGKILLed while a client's keyed function runs, then started again: the
client restarts the query on the same checkpoint, and every batch's output equals the values
computed in Python (docs/spark-connect.md, "Tests").

The query counts and sums ``v`` per key in a ``ValueState`` (``tests/support/keyed_functions.py``
``CountSum``), one input file per micro-batch; its ``foreachBatch`` (``BatchCollector``, run in
the server's Python process) keeps each batch's rows by batch id, so a batch replayed after a
kill replaces its rows. The server (its JVM, its Python workers: the whole process group) is
killed twice, each time with a batch planned and not committed; each restart is a new server on
a new port and a new client session, as after a machine's loss.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import keyedstate
import pytest

from tests.provider.test_kill_restart import SCHEMA, expected_batches, make_input
from tests.support.connect_mode import connect_mode, connect_session
from tests.support.keyed_functions import CountSum, last_per_key
from tests.support.servers.connect_server import ConnectServer
from tests.support.streaming_harness import (
    PROVIDER_CLASS_KEY,
    PROVIDER_UNDER_TEST,
    TEST_SETTINGS,
    BatchCollector,
    committed_batches,
    planned_batches,
)

FILES = 14
KILLS = 2
WAIT_S = 180.0


def start(spark: Any, source: Path, checkpoint: Path, collector: BatchCollector) -> Any:  # noqa: ANN401
    spark.conf.set(PROVIDER_CLASS_KEY, PROVIDER_UNDER_TEST)
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    counts = keyedstate.key_by(events, "key").process(
        CountSum(), "key string, cnt long, total long"
    )
    return (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(collector)
        .trigger(availableNow=True)
        .start()
    )


def wait_until(condition: Any, what: str, query: Any) -> None:  # noqa: ANN401
    deadline = time.monotonic() + WAIT_S
    while not condition():
        error = query.exception() if not query.isActive else None
        assert error is None, f"the query failed while waiting for {what}: {error}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S}s"
        time.sleep(0.05)


@pytest.mark.timeout(900)
def test_a_killed_connect_server_and_a_restarted_query_give_each_batch_once(
    tmp_path: Path,
) -> None:
    files = make_input(tmp_path / "input", FILES)
    expected = expected_batches(files)
    checkpoint = tmp_path / "checkpoint"
    collector = BatchCollector()
    kills = []
    for attempt in range(KILLS + 1):
        server = ConnectServer(settings=TEST_SETTINGS)
        server.start()
        spark = None
        try:
            spark = connect_session(server.url)
            with connect_mode():
                query = start(spark, tmp_path / "input", checkpoint, collector)
                if attempt == KILLS:
                    assert query.awaitTermination(WAIT_S), "the last run did not finish"
                    assert query.exception() is None, query.exception()
                    break
                # Some progress, then a batch planned and not committed: kill there.
                target = len(committed_batches(checkpoint)) + 3

                def in_flight(target: int = target) -> bool:
                    done, planned = committed_batches(checkpoint), planned_batches(checkpoint)
                    return len(done) >= target and bool(planned) and planned[-1] > done[-1]

                wait_until(in_flight, f"batch {target} in flight", query)
                server.kill()
                kills.append((planned_batches(checkpoint)[-1], committed_batches(checkpoint)[-1]))
        finally:
            if spark is not None:
                # A killed server cannot release the session: only close the client (and leave
                # PySpark's default session empty for the tests after this one).
                spark.release_session_on_close = server.running
                spark.stop()
            server.close()
    # Each kill left a batch planned and not committed, which the next run replayed.
    assert len(kills) == KILLS and all(planned > done for planned, done in kills), kills
    batches = {batch: last_per_key(rows) for batch, rows in collector.batches.items()}
    assert committed_batches(checkpoint)[-1] == FILES - 1  # (older entries are purged)
    assert batches == expected, f"kills (planned, committed): {kills}"
