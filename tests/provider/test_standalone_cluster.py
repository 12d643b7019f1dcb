"""State moves between executors on a real standalone cluster (a master and two workers).

The executors are killed mid-stream; the master starts new ones, which must load versions they
never wrote from the checkpoint. The final result must equal a batch
computation of the same input, and the progress must show that state was downloaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import DRIVERS
from tests.support.servers.spark_standalone import StandaloneCluster

DRIVER = DRIVERS / "cluster_job.py"


def test_partitions_load_state_written_by_killed_executors(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # Its own driver process: this test session may already hold a local SparkSession.
    run = subprocess.run(
        [sys.executable, str(DRIVER), standalone_cluster.url, str(tmp_path / "job")],
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
