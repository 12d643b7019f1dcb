"""keyedstate on each older Spark version it builds for, from one checkout (docs/architecture.md,
"Spark versions"): the version's pyspark in a virtualenv of its own (``make spark-venvs``:
build/venv-spark-<minor>/, with pyspark from PyPI and nothing of keyedstate installed), this
checkout's package on its path, and the provider jar ``make jars`` built for that version.

A keyed function with value state and Spark's streaming aggregation on the provider, each across
a restart on its checkpoint, give the values computed here; the jar for another Spark version is
refused at the session's start naming both versions.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from keyedstate._session import SUPPORTED_SPARK, spark_minor

from tests.support.paths import DRIVERS, PYTHON_SOURCES, REPO

JOB = DRIVERS / "spark_version_job.py"
INSTALLED = spark_minor()
OLDER = [minor for minor in SUPPORTED_SPARK if minor != INSTALLED]

# The job's two phases (spark_version_job.PHASES): a running total per key.
EXPECTED_KEYED = [[["a", 1], ["a", 4], ["b", 2]], [["a", 14], ["c", 1]]]
EXPECTED_AGGREGATION = [[["a", 4], ["b", 2]], [["a", 14], ["c", 1]]]

pytestmark = pytest.mark.timeout(600)


def run_job(
    minor: str, workdir: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    python = REPO / "build" / f"venv-spark-{minor}" / "bin" / "python"
    assert python.exists(), f"{python} is missing: `make spark-venvs` makes it"
    return subprocess.run(
        [str(python), str(JOB), str(workdir)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env=dict(
            os.environ,
            PYTHONPATH=str(PYTHON_SOURCES),
            PYSPARK_PYTHON=str(python),
            PYSPARK_DRIVER_PYTHON=str(python),
            **(env or {}),
        ),
    )


def test_an_older_spark_is_built_for() -> None:
    assert OLDER, f"keyedstate supports {SUPPORTED_SPARK} only: nothing older than {INSTALLED}"


@pytest.mark.parametrize("minor", OLDER)
def test_state_across_a_restart_on_an_older_spark(minor: str, tmp_path: Path) -> None:
    done = run_job(minor, tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["pyspark"].startswith(minor + "."), result["pyspark"]
    assert Path(result["jar"]).name == f"keyedstate-spark-{minor}.jar", result["jar"]
    assert result["keyed"] == EXPECTED_KEYED
    assert result["aggregation"] == EXPECTED_AGGREGATION


@pytest.mark.parametrize("minor", OLDER)
def test_a_jar_of_another_spark_is_refused_naming_both(minor: str, tmp_path: Path) -> None:
    other = Path(PYTHON_SOURCES, "keyedstate", "jars", f"keyedstate-spark-{INSTALLED}.jar")
    done = run_job(minor, tmp_path, {"KEYEDSTATE_JAR": str(other)})
    assert done.returncode != 0
    assert (
        f"[KEYEDSTATE_UNSUPPORTED_SPARK_VERSION] This keyedstate jar is for Spark {INSTALLED}, "
        f"and Spark {minor}." in done.stderr
    ), done.stderr[-4000:]
    assert f"use keyedstate-spark-{minor}.jar" in done.stderr
