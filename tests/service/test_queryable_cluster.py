"""Queryable state on a real standalone cluster (a master and two one-core workers on two loopback
hosts): the driver's proxy asks the executors' state servers over HTTP. Lookups equal the state
reader batch by batch; when an executor is killed, lookups keep answering a committed batch's
values (the lost executor's partitions read from the checkpoint by the driver), and every key is
served by the executors again once the query has run a batch on the executors it has then. The
driver runs in its own process (tests/support/drivers/queryable_job.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import DRIVERS
from tests.support.servers.spark_standalone import StandaloneCluster

pytestmark = pytest.mark.timeout(600)

SERVER_STARTED = re.compile(r"keyedstate state server of executor (\S+) at (http://\S+)")


def run_driver(cluster: StandaloneCluster, workdir: Path) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, str(DRIVERS / "queryable_job.py"), cluster.url, str(workdir)],
        capture_output=True, text=True, timeout=540, check=False, env=dict(os.environ),
    )  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert run.returncode == 0 and lines, (
        f"driver failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    summary: dict[str, Any] = json.loads(lines[-1].removeprefix("SUMMARY "))
    return summary


def test_lookups_through_the_executors_servers_and_an_executor_lost(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    summary = run_driver(standalone_cluster, tmp_path)
    keys = [f"user{i}" for i in range(16)]

    # Each executor ran a state server on its own host.
    servers = {
        match.group(1): match.group(2)
        for log in standalone_cluster.executor_logs(summary["app_id"])
        for match in SERVER_STARTED.finditer(log.read_text(errors="replace"))
    }
    assert summary["executors_before"] == 2
    hosts = {url.split("//")[1].split(":")[0] for url in servers.values()}
    assert {"127.0.0.1", "127.0.0.2"} <= hosts, servers

    for seen in summary["batches"]:
        assert seen["values"] == [seen["reader"].get(k) for k in keys], seen
    assert [b["batch"] for b in summary["batches"]] == sorted(
        b["batch"] for b in summary["batches"]
    )

    # While an executor is lost: a committed batch's exact values, its partitions read from the
    # checkpoint (the fallback) until they run elsewhere.
    by_batch = summary["readers_by_batch"]
    assert summary["during_loss"], "no lookup ran while the executor was lost"
    for answer in summary["during_loss"]:
        assert "error_id" not in answer, answer
        reader = by_batch[str(answer["batch"])]
        assert answer["values"] == [reader.get(k) for k in keys], answer
    after = summary["after_loss"]
    assert after["values"] == [after["reader"].get(k) for k in keys]
    lookups = len(summary["during_loss"])
    print(f"queryable on a cluster: servers {servers}; {lookups} lookups during the loss")
