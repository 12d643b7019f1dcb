"""State moves between executors on a real standalone cluster (a master and two workers).

The executors are killed mid-stream; the master starts new ones, which must load versions they
never wrote from the checkpoint. The final result must equal a batch
computation of the same input, and the progress must show that state was downloaded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).parent
DRIVER = Path(__file__).resolve().parent / "drivers" / "cluster_job.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_class(*args: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), *args],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


def wait_for_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("cluster-logs")
    port = free_port()
    procs = [
        spark_class(
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
            "--webui-port", str(free_port()), log=logs / "master.log",
        )
    ]
    try:
        wait_for_port(port)
        url = f"spark://127.0.0.1:{port}"
        for n in range(2):
            procs.append(
                spark_class(
                    "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                    "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                    "--work-dir", str(logs / f"work-{n}"), log=logs / f"worker-{n}.log",
                )
            )
        yield url
    finally:
        for p in reversed(procs):
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)


def test_partitions_load_state_written_by_killed_executors(cluster: str, tmp_path: Path) -> None:
    # Its own driver process: this test session may already hold a local SparkSession.
    run = subprocess.run(
        [sys.executable, str(DRIVER), cluster, str(tmp_path / "job")],
        capture_output=True, text=True, timeout=480, check=False,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("SUMMARY ")]
    output = f"{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    assert run.returncode == 0 and lines, f"driver failed:\n{output}"
    summary = json.loads(lines[-1].removeprefix("SUMMARY "))
    assert summary["executors"] >= 2, summary
    assert summary["bytes_downloaded_after_kill"] > 0, (
        f"no partition loaded state from the checkpoint after the kill: {summary}"
    )
    assert summary["keys"] == 40, summary
    assert summary["differences"] == 0, summary
