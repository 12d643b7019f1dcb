"""A Spark standalone cluster from the pyspark install: one master and one worker per host.

Each worker binds its own loopback address (127.0.0.1, 127.0.0.2, ...: all of 127.0.0.0/8 is the
loopback interface on Linux), so its executors report a host of their own. Spark never runs a
speculative copy of a task on a host where an attempt of that task already ran
(``TaskSetManager.hasAttemptOnHost``), so speculation needs workers on two hosts; on one address
(or in ``local-cluster`` mode, where every worker is ``localhost``) it never launches a copy.

Executors' logs are under ``<logs>/work-<n>/<app id>/<executor id>/stderr``; ``executor_pids``
finds the running executors' JVMs (for kill tests).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from tests.support.jvm_class_archive import EXECUTOR_OPTIONS_ENV
from tests.support.servers.ports import free_port

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT_S = 60.0


def _spark_class(*args: str, log: Path, host: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP=host)
    return subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), *args],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


def _wait_for_port(host: str, port: int, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


def executor_pids() -> list[int]:
    """The pids of the executor JVMs running on this machine."""
    out = subprocess.run(
        ["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True,
        check=False,
    )
    return [int(pid) for pid in out.stdout.split()]


def job_builder(master: str, app_name: str) -> SparkSession.Builder:
    """A driver's session on a cluster at ``master``: executors of one core and 768m, 4 shuffle
    partitions, no UI, the driver on 127.0.0.1, the executors' Python workers on this Python, and
    the tests' class-data archive (tests/support/jvm_class_archive.py) in the executors' JVMs."""
    builder = SparkSession.builder.master(master).appName(app_name)
    archive = os.environ.get(EXECUTOR_OPTIONS_ENV)
    if archive:
        builder = builder.config("spark.executor.extraJavaOptions", archive)
    return (
        builder
        .config("spark.executor.memory", "768m")
        .config("spark.executor.cores", "1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.pyspark.python", sys.executable)
    )


class StandaloneCluster:
    """A master on 127.0.0.1 and a worker with ``cores`` cores on each of ``hosts``."""

    def __init__(self, logs: Path, hosts: Sequence[str] = ("127.0.0.1", "127.0.0.2"),
                 cores: int = 1) -> None:
        self.logs = logs
        self.hosts = list(hosts)
        self.cores = cores
        self.url = ""
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> StandaloneCluster:
        port = free_port()
        self._procs.append(_spark_class(
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
            "--webui-port", str(free_port()), log=self.logs / "master.log", host="127.0.0.1",
        ))
        try:
            _wait_for_port("127.0.0.1", port)
            self.url = f"spark://127.0.0.1:{port}"
            for n, host in enumerate(self.hosts):
                self._procs.append(_spark_class(
                    "org.apache.spark.deploy.worker.Worker", self.url, "--host", host,
                    "--cores", str(self.cores), "--memory", "1g",
                    "--webui-port", str(free_port()), "--work-dir", str(self.work_dir(n)),
                    log=self.logs / f"worker-{n}.log", host=host,
                ))
        except BaseException:
            self.close()
            raise
        return self

    def work_dir(self, worker: int) -> Path:
        return self.logs / f"work-{worker}"

    def executor_logs(self, app_id: str) -> list[Path]:
        """The stderr of every executor the application had, on every worker."""
        return sorted(
            log for n in range(len(self.hosts))
            for log in (self.work_dir(n) / app_id).glob("*/stderr")
        )

    def close(self) -> None:
        for p in reversed(self._procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self._procs:
            p.wait(timeout=60)
        self._procs.clear()
