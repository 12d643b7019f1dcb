"""Throughput of keyedstate's exactly-once sinks against plain, non-transactional
``foreachBatch`` writes of the same batches, and the recovery time of a killed pipeline.

One run, one PostgreSQL server and one Kafka broker started here (tests/support/servers/). Each
competitor is called as ``foreachBatch`` calls it, ``write(df, batch_id)``, on the same batch
DataFrames (``--rows`` rows of (id bigint, word text, n bigint) each, computed by every call);
rounds are interleaved so that load on the machine hits all alike. Reported: rows per second of
the write calls (median over rounds) and each sink's ratio to its plain counterpart. Competitors:

* PostgreSQL: ``sinks.postgres`` append and upsert; plain append (the batch streamed to the
  driver, one ``COPY`` in autocommit: the sink's data path without its transaction); plain
  append from the executors (a ``COPY`` per partition); plain upsert (``executemany`` of
  ``INSERT ... ON CONFLICT``).
* Kafka: ``sinks.kafka`` (a transaction per partition, the default; and one per batch); plain:
  Spark's own Kafka writer (``df.write.format("kafka")``, at-least-once).

Recovery (``--skip-recovery`` leaves it out): the end-to-end pipeline of
tests/support/drivers/pipeline_driver.py (Kafka in, keyed state, both sinks) is SIGKILLed after a
few committed batches and restarted; reported are the seconds from the restart to its first newly
committed batch, against the seconds from the first start to its first batch.

    python bench/sink_bench.py                                  # 5 batches x 200k rows, 3 rounds
    python bench/sink_bench.py --rows 50000 --batches 3 --rounds 2   # quick
    python bench/sink_bench.py --only kafka --skip-recovery          # the Kafka rows alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.support
import keyedstate.sinks  # noqa: E402
from pyspark.sql import DataFrame, Row  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from tests.support.paths import DRIVERS  # noqa: E402
from tests.support.servers.kafka_broker import KafkaBroker  # noqa: E402
from tests.support.servers.postgres_server import PostgresServer  # noqa: E402
from tests.support.streaming_harness import (  # noqa: E402
    committed_batches,
    kill_process_group,
    session_builder,
)

Write = Callable[[DataFrame, int], None]
COLUMNS = "id, word, n"
PARTITIONS = 2


# ---------------------------------------------------------------------------------------------
# Plain writes: what a user writes without exactly once


def plain_copy(params: dict[str, Any], table: str) -> Write:
    """The batch streamed to the driver, one COPY in autocommit."""
    import psycopg

    connection = psycopg.connect(**params, autocommit=True)

    def write(df: DataFrame, batch_id: int) -> None:
        with connection.cursor().copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as copy:
            for row in df.toLocalIterator():
                copy.write_row(row)

    return write


def plain_partitions(params: dict[str, Any], table: str) -> Write:
    """Each partition COPYs from its executor (as ``df.write.jdbc`` inserts per partition)."""

    def write_partition(rows: Iterator[Row]) -> None:
        import psycopg

        with psycopg.connect(**params, autocommit=True) as connection:
            with connection.cursor().copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)

    def write(df: DataFrame, batch_id: int) -> None:
        df.foreachPartition(write_partition)

    return write


def plain_upsert(params: dict[str, Any], table: str) -> Write:
    """``executemany`` of INSERT ... ON CONFLICT in autocommit."""
    import psycopg

    connection = psycopg.connect(**params, autocommit=True)
    statement = (
        f"INSERT INTO {table} ({COLUMNS}) VALUES (%s, %s, %s) "
        "ON CONFLICT (id) DO UPDATE SET word = EXCLUDED.word, n = EXCLUDED.n"
    )

    def write(df: DataFrame, batch_id: int) -> None:
        with connection.cursor() as cursor:
            cursor.executemany(statement, df.toLocalIterator())

    return write


def as_records(df: DataFrame) -> DataFrame:
    return df.select(
        F.col("id").cast("string").alias("key"), F.to_json(F.struct(*df.columns)).alias("value")
    )


def plain_kafka(bootstrap: str, topic: str) -> Write:
    """Spark's own Kafka writer: at-least-once, producers cached per executor."""

    def write(df: DataFrame, batch_id: int) -> None:
        as_records(df).write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", topic
        ).save()

    return write


def exactly_once_kafka(bootstrap: str, topic: str, sink_id: str, scope: str) -> Write:
    sink = keyedstate.sinks.kafka(topic, bootstrap, sink_id=sink_id, scope=scope)

    def write(df: DataFrame, batch_id: int) -> None:
        sink(as_records(df), batch_id)

    return write


# ---------------------------------------------------------------------------------------------
# Throughput


def throughput(
    args: argparse.Namespace, spark: Any, pg: PostgresServer | None, kafka: KafkaBroker | None
) -> None:  # noqa: ANN401
    params = pg.params() if pg is not None else {}
    frames = [
        spark.range(b * args.rows, (b + 1) * args.rows, numPartitions=PARTITIONS).select(
            F.col("id"),
            F.concat(F.lit("word-"), (F.col("id") % 1000).cast("string")).alias("word"),
            (F.col("id") * 7).alias("n"),
        )
        for b in range(args.batches)
    ]
    sinks = keyedstate.sinks
    stamp = str(time.time_ns())
    # name -> (make(target, round), the plain competitor it is compared with, kind)
    postgres: dict[str, tuple[Callable[[str, int], Write], str | None]] = {
        "postgres: keyedstate append": (
            lambda t, r: sinks.postgres(t, sink_id=f"bench-{t}-{r}-{stamp}", **params),
            "postgres: plain append, driver COPY",
        ),
        "postgres: plain append, driver COPY": (lambda t, r: plain_copy(params, t), None),
        "postgres: plain append, executors COPY": (lambda t, r: plain_partitions(params, t), None),
        "postgres: keyedstate upsert": (
            lambda t, r: sinks.postgres(
                t, mode="upsert", key_columns=["id"], sink_id=f"bench-{t}-{r}-{stamp}", **params
            ),
            "postgres: plain upsert, executemany",
        ),
        "postgres: plain upsert, executemany": (lambda t, r: plain_upsert(params, t), None),
    }
    brokers = kafka.bootstrap_servers if kafka is not None else ""
    kafka_writes: dict[str, tuple[Callable[[str, int], Write], str | None]] = {
        "kafka: keyedstate, txn per partition": (
            lambda t, r: exactly_once_kafka(brokers, t, f"bench-{t}-{stamp}", "partition"),
            "kafka: plain, Spark's Kafka writer",
        ),
        "kafka: keyedstate, txn per batch": (
            lambda t, r: exactly_once_kafka(brokers, t, f"bench-{t}-{stamp}", "batch"),
            "kafka: plain, Spark's Kafka writer",
        ),
        "kafka: plain, Spark's Kafka writer": (lambda t, r: plain_kafka(brokers, t), None),
    }
    competitors = {
        **(postgres if pg is not None else {}),
        **(kafka_writes if kafka is not None else {}),
    }
    rates: dict[str, list[float]] = {name: [] for name in competitors}
    expected = args.rows * args.batches
    for round_ in range(-args.warmup, args.rounds):
        for index, (name, (make, _)) in enumerate(competitors.items()):
            if pg is not None and name.startswith("postgres"):
                target = f"bench_{index}"
                pg.execute(f"DROP TABLE IF EXISTS {target}")
                pg.execute(f"CREATE TABLE {target} (id bigint PRIMARY KEY, word text, n bigint)")
            else:
                assert kafka is not None
                target = kafka.create_topic(f"bench-{index}-{round_ + args.warmup}-{stamp}", 2)
            write = make(target, round_)
            started = time.perf_counter()
            for batch_id, df in enumerate(frames):
                write(df, batch_id)
            elapsed = time.perf_counter() - started
            if pg is not None and name.startswith("postgres"):
                count = pg.execute(f"SELECT count(*) FROM {target}")[0][0]
            else:
                assert kafka is not None
                count = len(kafka.read(target, "read_committed", timeout_s=120))
            assert count == expected, f"{name} wrote {count} rows, not {expected}"
            if round_ >= 0:
                rates[name].append(count / elapsed)
            print(f"round {round_} {name}: {count / elapsed:,.0f} rows/s", flush=True)

    print(
        f"\n{args.batches} batches x {args.rows:,} rows on {PARTITIONS} partitions, median of "
        f"{args.rounds} rounds (after {args.warmup} warm-up); load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("| write | rows/s | vs plain |\n|---|---:|---:|")
    for name, (_, plain) in competitors.items():
        rate = statistics.median(rates[name])
        versus = f"{rate / statistics.median(rates[plain]):.2f}" if plain else "-"
        print(f"| {name} | {rate:,.0f} | {versus} |")


# ---------------------------------------------------------------------------------------------
# Recovery after a kill


def recovery(args: argparse.Namespace, pg: PostgresServer, kafka: KafkaBroker) -> None:
    work = Path(tempfile.mkdtemp(prefix="keyedstate-sink-bench-"))
    stamp = str(time.time_ns())
    topic = kafka.create_topic(f"recovery-in-{stamp}", 2)
    kafka.produce(topic, ((f"k{i % 50}", str(i)) for i in range(args.recovery_records)))
    table = f"recovery_{stamp}"
    pg.execute(f'CREATE TABLE {table} (key text, "offset" bigint, cnt bigint, total bigint)')
    markers = work / "markers"
    markers.mkdir()
    config = work / "config.json"
    checkpoint = work / "checkpoint"
    config.write_text(
        json.dumps(
            {
                "bootstrap": kafka.bootstrap_servers,
                "input_topic": topic,
                "output_topic": kafka.create_topic(f"recovery-out-{stamp}", 2),
                "postgres": {k: v for k, v in pg.params().items() if v is not None},
                "table": table,
                "checkpoint": str(checkpoint),
                "markers": str(markers),
                "max_offsets": 20,
            }
        )
    )
    driver_script = DRIVERS / "pipeline_driver.py"

    def start() -> subprocess.Popen[bytes]:
        log = (work / f"driver-{time.time_ns()}.log").open("w")
        return subprocess.Popen(
            [sys.executable, str(driver_script), str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def commits() -> int:
        done = committed_batches(checkpoint)
        return done[-1] + 1 if done else 0

    def wait_commits(target: int, process: subprocess.Popen[bytes]) -> float:
        started = time.perf_counter()
        while commits() < target:
            if process.poll() is not None:
                raise RuntimeError(f"the pipeline driver exited early (logs in {work})")
            time.sleep(0.02)
        return time.perf_counter() - started

    first = start()
    to_first_batch = wait_commits(1, first)
    wait_commits(3, first)
    kill_process_group(first)
    done = commits()
    second = start()
    to_recovered = wait_commits(done + 1, second)
    kill_process_group(second)
    print(
        f"\nrecovery (pipeline driver, Kafka -> keyed state -> PostgreSQL + Kafka; load average "
        f"{os.getloadavg()[0]:.1f})"
    )
    print("| start | seconds to the first committed batch |\n|---|---:|")
    print(f"| first start (empty checkpoint) | {to_first_batch:.1f} |")
    print(f"| restart after SIGKILL at batch {done} | {to_recovered:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not counted")
    parser.add_argument("--skip-recovery", action="store_true")
    parser.add_argument(
        "--only", choices=("kafka", "postgres"), help="time one sink's rows (recovery needs both)"
    )
    parser.add_argument("--recovery-records", type=int, default=400)
    args = parser.parse_args()
    if args.only and not args.skip_recovery:
        parser.error("--only leaves a server out, which the recovery needs: add --skip-recovery")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = session_builder("keyedstate-sink-bench").config("spark.driver.memory", "2g")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    pg = PostgresServer() if args.only != "kafka" else None
    kafka = KafkaBroker() if args.only != "postgres" else None
    for server in (pg, kafka):
        if server is not None:
            server.start()
    try:
        throughput(args, spark, pg, kafka)
        if pg is not None and kafka is not None and not args.skip_recovery:
            recovery(args, pg, kafka)
    finally:
        spark.stop()
        for server in (kafka, pg):
            if server is not None:
                server.close()


if __name__ == "__main__":
    main()
