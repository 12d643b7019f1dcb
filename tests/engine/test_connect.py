"""Keyed functions from a Spark Connect client (docs/spark-connect.md): a real Connect server
started as a user starts one (``keyedstate connect-server``), the client in its own process
(tests/support/drivers/connect_client.py). Every kind of state, TTL, timers, a side output, a
chained keyed function, operator state and broadcast state give, phase by phase across a restart,
the rows the same functions give in the tests' classic session; a refused restart (another uid)
is keyedstate's error on the client, as in a classic session; the offline operations (state
read, inspect, savepoints taken, inspected, listed, restored, disposed of, a rescale, a running
query stopped with a savepoint, a missing checkpoint refused) answer as in the classic session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from pyspark.sql import SparkSession

from tests.support.connect_scenarios import (
    PHASES,
    QUERIES,
    outputs,
    run_operations,
    run_phase,
    write_inputs,
)
from tests.support.driver_process import Driver
from tests.support.paths import DRIVERS

CLIENT = DRIVERS / "connect_client.py"


def on_connect(
    server: Any,  # noqa: ANN401
    root: Path,
    log: Path,
    drivers: list[Driver],
    *options: str,
) -> dict[str, Any]:
    client = Driver([server.url, str(root), *options], log, script=CLIENT)
    drivers.append(client)
    rc = client.wait(timeout=600)
    assert rc == 0, f"the Connect client failed (rc={rc}):\n{client.tail()}"
    lines = [x for x in log.read_text().splitlines() if x.startswith("SUMMARY ")]
    assert lines, f"the Connect client printed no summary:\n{client.tail()}"
    return dict(json.loads(lines[-1].removeprefix("SUMMARY ")))


@pytest.mark.timeout(1200)
def test_keyed_functions_on_spark_connect_give_what_a_classic_session_gives(
    spark: SparkSession,
    connect_server: Any,
    tmp_path: Path,
    drivers: list[Driver],  # noqa: ANN401
) -> None:
    classic, remote = tmp_path / "classic", tmp_path / "connect"
    for phase in range(len(PHASES)):
        write_inputs(classic, phase)
        write_inputs(remote, phase)
        run_phase(spark, classic)
        log = tmp_path / f"client-{phase}.log"
        last = phase == len(PHASES) - 1
        options = ["--uid-change"] if phase == 0 else ["--operations"] if last else []
        summary = on_connect(connect_server, remote, log, drivers, *options)
        assert summary["session"].startswith("pyspark.sql.connect."), summary
        if phase == 0:
            # keyedstate's error, as a classic session's client gets it from the same failure.
            assert summary["uid_change"] == {
                "raised": "pyspark.errors.exceptions.connect.StreamingQueryException",
                "class": "KeyedFunctionError",
                "error_id": "KEYED_FUNCTION_UID_CHANGED",
            }, summary
        got, expected = outputs(remote), outputs(classic)
        for name in QUERIES:
            assert got[name] == expected[name], f"phase {phase}, {name}"
    # The offline operations on the last phase's checkpoints: the same answers on both sides.
    operations = json.loads(json.dumps(run_operations(spark, classic)))
    assert summary["operations"] == operations
    assert operations["counts"] == [["a", 3], ["b", 2], ["c", 2], ["d", 1]], operations
    assert operations["restored"][2] == operations["counts"], operations
    assert operations["refused"] == [
        ["QueryCheckpointError", "KEYEDSTATE_QUERY_CHECKPOINT_INVALID"],
        ["RescaleError", "KEYEDSTATE_RESCALE_REFUSED"],
        ["QueryCheckpointError", "KEYEDSTATE_QUERY_CHECKPOINT_INVALID"],
    ], operations
    assert operations["stopped"][2] is False, operations
    assert operations["transformed"][2] == [[k, 10 * n] for k, n in operations["counts"]]
    assert "seen" not in operations["transformed"][1], operations
    assert operations["bootstrapped"][1:] == [["chained"], [["a", 2], ["e", 1]]], operations
    # Not two empty runs: what the functions must have given across the restart.
    main = [r for r in got["kinds"] if r[6] is None]  # (k, count, ..., side_output, big.k, big.v)
    assert max(r[1] for r in main if r[0] == "a") == 3, main
    assert sorted({r[0] for r in main if r[1] != -1}) == ["a", "b", "c", "d"]
    assert [r for r in main if r[1] == -1], "no timer fired"
    assert sorted(r[7:] for r in got["kinds"] if r[6] == "big") == [("a", 15), ("b", 12)]
    assert {r[2] for r in got["broadcast"]} == {"any", "big"}
    assert len(got["operator"]) == sum(len(f) for p in PHASES for f in p["events"])


def test_a_client_of_another_keyedstate_version_is_refused_naming_both(
    connect_server: Any,  # noqa: ANN401
    tmp_path: Path,
    drivers: list[Driver],
) -> None:
    summary = on_connect(
        connect_server, tmp_path, tmp_path / "client.log", drivers, "--client-version", "0.0.9"
    )
    refused = summary["other_version"]
    assert refused["class"] == "InvalidOptionError", refused
    assert refused["error_id"] == "KEYEDSTATE_CONNECT_VERSION_MISMATCH", refused
    assert (
        f"keyedstate 0.0.9 and the server runs keyedstate {keyedstate.__version__}"
        in (refused["message"])
    ), refused
