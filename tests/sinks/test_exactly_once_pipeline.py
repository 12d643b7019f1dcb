"""End to end exactly once: Kafka in, keyed state, PostgreSQL and Kafka out, with the driver
SIGKILLed at random points and the database and the broker killed mid-run.

The driver (tests/support/drivers/pipeline_driver.py) reads a Kafka topic a few records per
micro-batch, keeps a running count and sum per key in keyedstate state, and writes one row per event
to a PostgreSQL table and, transactionally, to a Kafka topic, under a fixed-delay restart strategy.
The driver runs on a checkpoint and is SIGKILLed ``PIPELINE_KILLS`` times (4 in CI, 6 in ``make
test-full``: once at each kill point; ``make soak`` runs the issue's 20, about 12 minutes) at seeded
random points: while it starts, with a batch in
flight, inside the sinks (PostgreSQL written, Kafka not yet), right after a batch's sinks, after a
commit. Once each, while it runs, the PostgreSQL server and the Kafka broker are killed and
restarted (the restart strategy brings the query back). Each time the driver restarts on the same
checkpoint. At the end the table and the ``read_committed`` topic must equal the values computed
here: nothing lost, nothing duplicated (``make soak`` also runs the driver uninterrupted, with
``PIPELINE_CLEAN_RUN=1``, and checks that it writes the same).

PIPELINE_SEED picks the kill points; the seed and the kill log are printed.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.driver_process import Driver, wait_for
from tests.support.paths import DRIVERS
from tests.support.streaming_harness import committed_batches, planned_batches
from tests.support.tiers import FULL

DRIVER = DRIVERS / "pipeline_driver.py"
# Once per kill point in the full tier; CI leaves out the last two (after the sinks, after a
# commit).
KILLS = int(os.environ.get("PIPELINE_KILLS", "6" if FULL else "4"))
CLEAN_RUN = os.environ.get("PIPELINE_CLEAN_RUN") == "1"
SEED = int(os.environ.get("PIPELINE_SEED", "20261122"))
RECORDS = 360
KEYS = 12
MAX_OFFSETS = 6  # per micro-batch, over 2 partitions: about 60 batches
WAIT_TIMEOUT_S = 180.0


def expected_rows(records: list[tuple[int, str, int]]) -> list[tuple[str, int, int, int]]:
    """(key, offset, cnt, total) per input record given as (partition, key, v) in partition then
    offset order; a fresh topic written without transactions numbers each partition 0, 1, ..."""
    rows = []
    totals: dict[str, tuple[int, int]] = {}
    offsets: dict[int, int] = {}
    for partition, key, v in records:
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        cnt, total = totals.get(key, (0, 0))
        totals[key] = (cnt + 1, total + v)
        rows.append((key, offset, cnt + 1, total + v))
    return sorted(rows)


def table_rows(postgres: Any, table: str) -> list[tuple[str, int, int, int]]:  # noqa: ANN401
    return sorted(
        tuple(r) for r in postgres.execute(f"SELECT key, \"offset\", cnt, total FROM {table}")
    )


def topic_rows(kafka: Any, topic: str) -> list[tuple[str, int, int, int]]:  # noqa: ANN401
    rows = []
    for _, _, value in kafka.read(topic, isolation_level="read_committed", timeout_s=60):
        row = json.loads(value)
        rows.append((row["key"], row["offset"], row["cnt"], row["total"]))
    return sorted(rows)


@pytest.mark.timeout(600 + 90 * KILLS)
def test_kills_and_outages_are_exactly_once_end_to_end(
    kafka_broker: Any,  # noqa: ANN401
    postgres_server: Any,  # noqa: ANN401
    tmp_path: Path,
    drivers: list[Driver],
) -> None:
    rng = random.Random(SEED)
    print(f"PIPELINE_SEED={SEED} kills={KILLS}")
    run = f"p{SEED}x{os.getpid()}"
    input_topic = kafka_broker.create_topic(f"{run}-in", partitions=2)
    data = random.Random(7)
    kafka_broker.produce(
        input_topic,
        ((f"k{data.randrange(KEYS)}", str(data.randrange(1, 1000))) for _ in range(RECORDS)),
    )
    produced = [
        (partition, key.decode(), int(value))
        for partition, key, value in kafka_broker.read(input_topic, "read_uncommitted")
    ]
    assert len(produced) == RECORDS
    expected = expected_rows(produced)

    def config(name: str) -> Path:
        table = f"{run}_{name}".replace("-", "_")
        postgres_server.execute(
            f"CREATE TABLE {table} (key text, \"offset\" bigint, cnt bigint, total bigint)"
        )
        path = tmp_path / f"{name}.json"
        markers = tmp_path / f"{name}-markers"
        markers.mkdir()
        path.write_text(
            json.dumps(
                {
                    "bootstrap": kafka_broker.bootstrap_servers,
                    "input_topic": input_topic,
                    "output_topic": kafka_broker.create_topic(f"{run}-{name}-out", partitions=2),
                    "postgres": {
                        k: v for k, v in postgres_server.params().items() if v is not None
                    },
                    "table": table,
                    "checkpoint": str(tmp_path / f"{name}-checkpoint"),
                    "markers": str(markers),
                    "max_offsets": MAX_OFFSETS,
                }
            )
        )
        return path

    # The reference: the values computed here; with PIPELINE_CLEAN_RUN=1 (``make soak``), also an
    # uninterrupted run of the same driver, whose table and topic must equal them.
    if CLEAN_RUN:
        clean_config = config("clean")
        clean = Driver([str(clean_config)], tmp_path / "driver-clean.log", script=DRIVER)
        drivers.append(clean)
        rc = clean.wait(timeout=WAIT_TIMEOUT_S * 2)
        assert rc == 0, f"uninterrupted driver failed (rc={rc}):\n{clean.tail()}"
        clean_settings = json.loads(clean_config.read_text())
        assert table_rows(postgres_server, clean_settings["table"]) == expected, (
            "the uninterrupted run's table is wrong"
        )
        assert topic_rows(kafka_broker, clean_settings["output_topic"]) == expected, (
            "the uninterrupted run's topic is wrong"
        )

    killed_config = config("killed")
    settings = json.loads(killed_config.read_text())
    checkpoint = Path(settings["checkpoint"])
    markers = Path(settings["markers"])

    def commits() -> int:
        done = committed_batches(checkpoint)
        return done[-1] + 1 if done else 0

    def in_flight() -> bool:
        offsets, done = planned_batches(checkpoint), committed_batches(checkpoint)
        return bool(offsets) and (not done or offsets[-1] > done[-1])

    def next_marker(prefix: str) -> Callable[[], bool]:
        """True once a batch after the ones marked so far reaches ``prefix``."""
        seen = {p.name for p in markers.glob(f"{prefix}-*")}
        return lambda: any(p.name not in seen for p in markers.glob(f"{prefix}-*"))

    def startup(driver: Driver) -> None:  # the JVM starting, the query initializing
        time.sleep(rng.uniform(0.5, 5.0))

    def mid_batch(driver: Driver) -> None:  # a batch planned, not committed
        target = commits() + rng.randint(1, 3)
        wait_for(driver, lambda: commits() >= target, f"{target} commits", WAIT_TIMEOUT_S)
        wait_for(driver, in_flight, "a batch in flight", WAIT_TIMEOUT_S)

    def in_sinks(driver: Driver) -> None:  # somewhere inside the two sinks' transactions
        wait_for(driver, next_marker("sink"), "a batch entering its sinks", WAIT_TIMEOUT_S)
        time.sleep(rng.uniform(0.0, 0.4))

    def between_sinks(driver: Driver) -> None:  # PostgreSQL committed, Kafka not yet
        wait_for(driver, next_marker("postgres"), "a batch's PostgreSQL commit", WAIT_TIMEOUT_S)

    def after_sinks(driver: Driver) -> None:  # both sinks committed, Spark's commit log not yet
        wait_for(driver, next_marker("kafka"), "a batch's Kafka commit", WAIT_TIMEOUT_S)

    def after_commit(driver: Driver) -> None:
        target = commits() + rng.randint(1, 3)
        wait_for(driver, lambda: commits() >= target, f"{target} commits", WAIT_TIMEOUT_S)

    def outage(server: Any, name: str) -> Callable[[Driver], None]:  # noqa: ANN401
        def phase(driver: Driver) -> None:
            target = commits() + 1
            wait_for(driver, lambda: commits() >= target, f"{target} commits", WAIT_TIMEOUT_S)
            server.kill()
            time.sleep(rng.uniform(2.0, 4.0))
            server.start()
            # The restart strategy brings the query back: wait for progress past the outage.
            after = commits() + 2
            wait_for(
                driver, lambda: commits() >= after, f"{after} commits after the {name}",
                WAIT_TIMEOUT_S,
            )

        phase.__name__ = f"{name}_outage"
        return phase

    later = [mid_batch, in_sinks, between_sinks, after_sinks, after_commit]
    phases: list[Callable[[Driver], None]] = [startup, *later]
    phases += [rng.choice(later) for _ in range(max(0, KILLS - len(phases)))]
    phases = phases[:KILLS]
    # Each outage runs in its own attempt (not the first), before that attempt's kill.
    assert len(phases) >= 3, "PIPELINE_KILLS must be at least 3"
    database_at, broker_at = rng.sample(range(1, len(phases)), 2)
    outages = {
        database_at: outage(postgres_server, "database"),
        broker_at: outage(kafka_broker, "broker"),
    }

    log: list[str] = []
    t0 = time.monotonic()
    for attempt, phase in enumerate(phases):
        driver = Driver([str(killed_config)], tmp_path / f"driver-{attempt}.log", script=DRIVER)
        drivers.append(driver)
        fault = outages.get(attempt)
        if fault is not None:
            fault(driver)
            log.append(f"{time.monotonic() - t0:6.1f}s attempt {attempt}: {fault.__name__} ok")
            print(log[-1])
        phase(driver)
        alive = driver.alive()
        before = commits()
        driver.kill_group()
        log.append(
            f"{time.monotonic() - t0:6.1f}s attempt {attempt}: killed {phase.__name__} "
            f"after {before} commits (alive={alive})"
        )
        print(log[-1])
        assert alive, f"driver had exited when killed:\n{driver.tail()}"

    final = Driver([str(killed_config)], tmp_path / "driver-final.log", script=DRIVER)
    drivers.append(final)
    rc = final.wait(timeout=WAIT_TIMEOUT_S * 2)
    assert rc == 0, f"restarted driver failed (rc={rc}):\n{final.tail()}"
    history = "\n".join(log)
    assert sum("outage" in line for line in log) == 2, history

    killed_table = table_rows(postgres_server, settings["table"])
    killed_topic = topic_rows(kafka_broker, settings["output_topic"])
    assert killed_table == expected, f"PostgreSQL differs after kills (seed {SEED}):\n{history}"
    assert killed_topic == expected, f"Kafka differs after kills (seed {SEED}):\n{history}"
