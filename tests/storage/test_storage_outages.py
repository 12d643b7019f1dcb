"""Storage outages in the middle of a batch (issue 12): an HDFS datanode killed while the
provider uploads, the S3 endpoint stopped while a commit uploads, the local disk full. Each
fault lands at a chosen moment (a hook in the test server, not a timer), the batch either
survives it or fails with an error naming the cause, and after the fault clears the restarted
query's output equals an uninterrupted run's (computed here in Python, batch by batch: nothing
lost, nothing duplicated).

The query: a running count and sum per key (Spark's streaming aggregation in update mode, the
provider under test, 2 state partitions), one input file per micro-batch, keys padded with
incompressible text so the state and its uploads have the size a test needs. Its checkpoint is
on the storage under test (on the local disk for the disk-full test).

- HDFS (tests/support/servers/hdfs_cluster.py, 3 datanodes, replication 3): the minicluster holds
  the upload of batch 2's changelog (changelog checkpointing) or of its first SST file (a snapshot
  per commit) after the first packet, in every datanode of its pipeline, unacknowledged
  (``hold_writes``, dev/storage/MiniHdfs.java); the test then stops the pipeline's first datanode
  and lets the others go on. The query then continues with a fresh local directory (so every state
  file is read back from HDFS, with that datanode still down).
- S3 (tests/support/servers/s3_endpoint.py, moto behind a switch): the endpoint goes down the moment
  batch 2's commit sends the PUT of its changelog or of its manifest (``stop_on_request``); the
  batch must fail within ``S3_FAILURE_BOUND_S`` naming the object and the endpoint, then the
  endpoint comes back and the query restarts.
- Local disk: the provider's local directory (``localDir``) on a 4 MB tmpfs; batch 2's state
  does not fit (in its changelog, or in the SST file of a snapshot commit); the batch must fail
  naming the directory and "No space left on device"; the tmpfs is then grown (``mount -o
  remount``) and the query restarts. Mounting needs root (CI runs as root): without it the test
  fails, saying so.

docs/reliability.md ("Storage outages") has the results and times.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.remote_storage import apply_hadoop_settings
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    QUERY_TIMEOUT_S,
    BatchCollector,
    FileInput,
    session_conf,
    sort_rows,
    start_query,
)

OPTION = "spark.sql.streaming.stateStore.keyedstate."
CHANGELOG = OPTION + "changelogCheckpointing"
LOCAL_DIR = OPTION + "localDir"
# How the upload under test is made: the commit's changelog, or a snapshot of every commit.
MODES = {"changelog": "true", "snapshot": "false"}
# A batch that fails because the S3 endpoint is down must fail within this (s3a's retries, see
# S3Endpoint.hadoop_settings: 3 attempts, 200 ms apart, 5 s to connect).
S3_FAILURE_BOUND_S = 60.0
DISK_SIZE = "4m"

SCHEMA = StructType([StructField("key", StringType()), StructField("v", LongType())])
Rows = list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------
# The query, its input and its expected output


def padded_key(i: int, pad: int) -> str:
    """``k<i>-`` and ``pad`` characters of deterministic, incompressible text (base64 of a
    hash): state whose size the test controls."""
    noise = base64.b64encode(hashlib.shake_256(str(i).encode()).digest(pad)).decode()[:pad]
    return f"k{i:06d}-{noise}"


def batch(number: int, keys: range, pad: int) -> Rows:
    return [{"key": padded_key(i, pad), "v": number * 100000 + i} for i in keys]


def count_sum(events: DataFrame) -> DataFrame:
    totals = events.groupBy("key").agg(F.count("*").alias("cnt"), F.sum("v").alias("total"))
    return totals.select(F.substring("key", 1, 7).alias("id"), "cnt", "total")


def expected_batches(files: list[Rows]) -> dict[int, Rows]:
    """Each batch's output in update mode: every key it touched, with its running count and sum."""
    state: dict[str, tuple[int, int]] = {}
    out = {}
    for number, rows in enumerate(files):
        touched = {}
        for row in rows:
            cnt, total = state.get(row["key"], (0, 0))
            state[row["key"]] = touched[row["key"]] = (cnt + 1, total + row["v"])
        out[number] = sort_rows(
            {"id": key[:7], "cnt": cnt, "total": total} for key, (cnt, total) in touched.items()
        )
    return out


class Run:
    """One query over a growing input and one checkpoint, restarted as the test goes."""

    def __init__(self, spark: SparkSession, workdir: Path, checkpoint: str) -> None:
        self.spark = spark
        self.source = FileInput(workdir / "events", SCHEMA)
        self.checkpoint = checkpoint
        self.collector = BatchCollector()
        self.files: list[Rows] = []

    def start(self, *files: Rows) -> StreamingQuery:
        for rows in files:
            self.source.add(rows)
            self.files.append(rows)
        frame = count_sum(self.source.read_stream(self.spark))
        return start_query(
            self.spark,
            PROVIDER_UNDER_TEST,
            frame,
            "update",
            self.checkpoint,  # type: ignore[arg-type]
            self.collector,  # type: ignore[arg-type]
        )

    def run(self, *files: Rows) -> None:
        """Process ``files`` (and anything not yet processed) to the end; must succeed."""
        error = finish(self.start(*files))
        assert error is None, f"the query failed: {error[:3000]}"

    def assert_exact(self) -> None:
        expected = expected_batches(self.files)
        assert sorted(self.collector.batches) == sorted(expected), "batches lost or added"
        for number, rows in expected.items():
            got = self.collector.batches[number]
            assert got == rows, f"batch {number}: {len(got)} rows, expected {len(rows)}"


def finish(query: StreamingQuery, timeout_s: float = QUERY_TIMEOUT_S) -> str | None:
    """Waits for an availableNow query to end: None if it finished, else its error's text."""
    try:
        if not query.awaitTermination(timeout_s):
            query.stop()
            raise AssertionError(f"the query did not end in {timeout_s} s")
    except StreamingQueryException as error:
        return str(error)
    error = query.exception()
    return None if error is None else str(error)


def cause_line(error: str, pattern: str) -> str:
    """The first line of ``error`` (the query's failure, executor stack traces included) that
    matches ``pattern``: the message a user reads for the cause."""
    for line in error.splitlines():
        if re.search(pattern, line):
            return line.strip()
    raise AssertionError(f"no line of the error matches {pattern!r}:\n{error[:6000]}")


# ---------------------------------------------------------------------------------------------
# HDFS: a datanode killed mid-upload


@pytest.mark.parametrize("mode", list(MODES))
def test_hdfs_datanode_killed_mid_upload(
    mode: str,
    spark: SparkSession,
    hdfs_cluster: Any,
    tmp_path: Path,  # noqa: ANN401
) -> None:
    cluster = hdfs_cluster
    apply_hadoop_settings(spark, cluster.hadoop_settings())
    name = f"t{time.time_ns()}/datanode-{mode}"
    run = Run(spark, tmp_path, cluster.uri(name))
    stopped: int | None = None
    with session_conf(spark, {CHANGELOG: MODES[mode]}):
        run.run(batch(0, range(0, 300), 40), batch(1, range(150, 450), 40))
        # Batch 2 (version 3 of each partition): partition 0's changelog, or the first SST file
        # of its snapshot, is held after its first packet (about 200 KB to send), and the first
        # datanode of its pipeline is stopped.
        folder = "changelog" if mode == "changelog" else "shared"
        cluster.hold_writes(rf"^/{name}/state/0/0/{folder}/")
        try:
            query = run.start(batch(2, range(300, 2300), 100))
            held = cluster.await_held_write(60)
            assert len(held["pipeline"]) == 3, held  # replication 3: all three datanodes
            stopped = int(held["pipeline"][0])
            cluster.stop_datanode(stopped)
            cluster.release_writes()
            error = finish(query)
            if error is None:
                # Written through pipeline recovery: every block on the two datanodes left.
                stopped_port = cluster.datanode_addresses[stopped].rsplit(":", 1)[1]
                replicas = cluster.block_locations(held["path"])
                assert replicas and all(len(nodes) == 2 for nodes in replicas), replicas
                assert not any(n.endswith(f":{stopped_port}") for b in replicas for n in b)
                outcome = "the upload survived (pipeline recovery on the 2 datanodes left)"
            else:
                # Failed: it says which upload and why; the restart replays the batch.
                line = cause_line(error, r"Cannot upload")
                assert held["path"] in line, line
                outcome = f"the batch failed: {line}"
            print(f"datanode {stopped} stopped while {held['path']} was written: {outcome}")
            # Continue with an empty local directory: every file of version 3 is downloaded (and
            # checked against its manifest's size and CRC32C) from HDFS, one datanode still down.
            with session_conf(spark, {LOCAL_DIR: str(tmp_path / "fresh-local-dir")}):
                run.run(batch(3, range(0, 600, 3), 40))
        finally:
            cluster.release_writes()
            if stopped is not None:
                cluster.restart_datanode(stopped)
    run.assert_exact()


# ---------------------------------------------------------------------------------------------
# S3: the endpoint stopped mid-commit


@pytest.mark.parametrize("upload", ["changelog", "manifest"])
def test_s3_endpoint_stopped_mid_commit(
    upload: str,
    spark: SparkSession,
    s3_endpoint: Any,
    tmp_path: Path,  # noqa: ANN401
) -> None:
    endpoint = s3_endpoint
    apply_hadoop_settings(spark, endpoint.hadoop_settings())
    name = f"t{time.time_ns()}/endpoint-{upload}"
    run = Run(spark, tmp_path, endpoint.uri(name))
    run.run(batch(0, range(0, 300), 40), batch(1, range(150, 450), 40))
    # Batch 2 commits version 3 of each partition: the endpoint goes down as partition 0 sends
    # the PUT of its changelog, or of its manifest (written in place on S3).
    target = "changelog/3-" if upload == "changelog" else r"3\.manifest"
    endpoint.stop_on_request(rf"^PUT /{endpoint.bucket}/{name}/state/0/0/{target}")
    try:
        query = run.start(batch(2, range(300, 1300), 40))
        request = endpoint.await_stopped(60)
        down_at = time.monotonic()
        error = finish(query)
        failed_after = time.monotonic() - down_at
        assert error is not None, f"the batch committed without the endpoint ({request})"
        line = cause_line(error, r"Failed to commit version 3 of state store")
        assert f"s3a://{endpoint.bucket}/{name}/state/0/" in line, line
        assert f"127.0.0.1:{endpoint.port}" in line, line  # the endpoint it could not reach
        assert failed_after < S3_FAILURE_BOUND_S, f"failed after {failed_after:.1f} s: {line}"
        print(
            f"endpoint down at {request}; the batch failed after {failed_after:.1f} s "
            f"({len(error)} characters of error): {line}"
        )
    finally:
        endpoint.restart()
    run.run(batch(3, range(0, 600, 3), 40))
    run.assert_exact()


# ---------------------------------------------------------------------------------------------
# Local disk full


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Callable[[str], None]]:
    """A tmpfs of ``size`` mounted at ``path``; yields a function that resizes it in place."""
    path.mkdir(parents=True, exist_ok=True)

    def mount(*args: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.fail(
                f"cannot mount a tmpfs at {path} (`mount {' '.join(args)}`: "
                f"{(done.stderr or done.stdout).strip()}): this test needs root (CI runs as root)",
                pytrace=False,
            )

    if os.geteuid() != 0:
        pytest.fail(
            "the local-disk-full test mounts a small tmpfs as the provider's local directory "
            "and needs root for it (CI runs as root); run it as root",
            pytrace=False,
        )
    mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield lambda new_size: mount("-o", f"remount,size={new_size}", str(path))
    finally:
        # Lazy: the failed run's provider may still hold files open until Spark unloads it.
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("mode", list(MODES))
def test_local_disk_full(mode: str, spark: SparkSession, tmp_path: Path) -> None:
    disk = tmp_path / "small-local-disk"
    run = Run(spark, tmp_path, str(tmp_path / "checkpoint"))
    with (
        small_disk(disk, DISK_SIZE) as resize,
        session_conf(spark, {CHANGELOG: MODES[mode], LOCAL_DIR: str(disk)}),
    ):
        run.run(batch(0, range(0, 300), 40), batch(1, range(150, 450), 40))
        # Two RocksDB instances and two versions: a few KB each, nothing reserved up front
        # (RocksDB's default would fallocate 4 MB per instance for its MANIFEST).
        stat = os.statvfs(disk)
        used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        assert used < 1 << 20, f"{used} bytes of the local disk used by two small versions"
        # About 7 MB of new state in batch 2: its changelog (or the SST file of its snapshot)
        # does not fit in 4 MB.
        error = finish(run.start(batch(2, range(1000, 25000), 280)))
        assert error is not None, "a batch larger than the local disk committed"
        line = cause_line(error, r"Cannot write .*No space left on device")
        assert str(disk) in line and "localDir" in line, line
        print(f"batch 2 failed ({len(error)} characters of error): {line}")
        resize("256m")
        run.run(batch(3, range(0, 600, 3), 40))
    run.assert_exact()
