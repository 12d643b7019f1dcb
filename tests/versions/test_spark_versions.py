"""keyedstate on each older Spark version it builds for, from one checkout (docs/architecture.md,
"Spark versions"): the version's pyspark in a virtualenv of its own (``make spark-venvs``:
build/venv-spark-<minor>/, with pyspark from PyPI and nothing of keyedstate installed), and this
checkout's wheel, which carries the jar ``make jars`` built for each version, installed on its path
(without its dependencies: the wheel's pyspark range is checked against the supported versions).

On each version (tests/support/drivers/spark_version_job.py): a keyed function with value state
and Spark's streaming aggregation on the provider, each across a restart, give the values computed
here; the keyed function's state reads back; the provider's metrics are in the progress; a
canonical savepoint restores into Spark's HDFS-backed provider and continues there, and into
Spark's RocksDB provider where that Spark can open an empty store at a batch (4.2+); Spark's
``transformWithStateInPandas`` is refused on keyedstate's provider. Both checkpoints then continue
on the installed Spark: a checkpoint written by one version is read by another. The jar for
another Spark version is refused at the session's start naming both versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from keyedstate._session import SUPPORTED_SPARK, spark_minor

from tests.support.paths import DRIVERS, PYTHON_SOURCES, REPO

JOB = DRIVERS / "spark_version_job.py"
INSTALLED = spark_minor()
OLDER = [minor for minor in SUPPORTED_SPARK if minor != INSTALLED]

# The job's three phases (spark_version_job.PHASES): a running total per key.
EXPECTED_KEYED = [[["a", 1], ["a", 4], ["b", 2]], [["a", 14], ["c", 1]]]
EXPECTED_AGGREGATION = [[["a", 4], ["b", 2]], [["a", 14], ["c", 1]]]
EXPECTED_PHASE_2 = [["a", 114], ["b", 7]]
EXPECTED_STATE = [["a", 14], ["b", 2], ["c", 1]]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """keyedstate as a user installs it: this checkout's wheel (every Spark version's jar in it,
    or the build refuses), installed without its dependencies into a folder that the older
    versions' virtualenvs put on their path."""
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "-w", str(out / "dist"), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = (out / "dist").glob("keyedstate-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        jars = sorted(n for n in archive.namelist() if n.startswith("keyedstate/jars/"))
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = archive.read(metadata).decode()
    assert jars == [f"keyedstate/jars/keyedstate-spark-{m}.jar" for m in SUPPORTED_SPARK], jars
    next_minor = f"4.{int(SUPPORTED_SPARK[-1].split('.')[1]) + 1}"
    assert f"Requires-Dist: pyspark<{next_minor},>={SUPPORTED_SPARK[0]}" in requires, requires
    site = out / "site"
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    return site


def run_job(
    minor: str,
    workdir: Path,
    step: str = "write",
    env: dict[str, str] | None = None,
    site: Path = PYTHON_SOURCES,
) -> subprocess.CompletedProcess[str]:
    if minor == INSTALLED:
        python = Path(sys.executable)
    else:
        python = REPO / "build" / f"venv-spark-{minor}" / "bin" / "python"
        assert python.exists(), f"{python} is missing: `make spark-venvs` makes it"
    return subprocess.run(
        [str(python), str(JOB), str(workdir), step],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env=dict(
            os.environ,
            PYTHONPATH=str(site),
            PYSPARK_PYTHON=str(python),
            PYSPARK_DRIVER_PYTHON=str(python),
            **(env or {}),
        ),
    )


def test_an_older_spark_is_built_for() -> None:
    assert OLDER, f"keyedstate supports {SUPPORTED_SPARK} only: nothing older than {INSTALLED}"


def result_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.parametrize("minor", OLDER)
def test_state_on_an_older_spark_and_continued_on_the_installed_one(
    minor: str, tmp_path: Path, wheel_site: Path
) -> None:
    result = result_of(run_job(minor, tmp_path, site=wheel_site))
    assert result["pyspark"].startswith(minor + "."), result["pyspark"]
    assert (
        Path(result["jar"]) == wheel_site / "keyedstate" / "jars" / f"keyedstate-spark-{minor}.jar"
    )
    assert result["keyed"] == EXPECTED_KEYED
    assert result["aggregation"] == EXPECTED_AGGREGATION
    assert result["read"] == EXPECTED_STATE
    assert {"keyedstateCommitFlushMs", "keyedstateSstFilesBytes"} <= set(result["metrics"]), result[
        "metrics"
    ]
    # Spark's HDFS-backed provider, restored into at batch 1 and continued (on 4.1 from the
    # delta it wrote: 4.1 has no forceSnapshotOnCommit).
    assert result["hdfs_restored"] == EXPECTED_PHASE_2
    if minor in ("4.0", "4.1"):  # getStore has no loadEmpty before 4.2
        assert result["rocksdb_restore"].startswith(
            "InvalidOptionError: [KEYEDSTATE_UNSUPPORTED_SPARK_VERSION]"
        ), result
        assert "getStore's loadEmpty is new in Spark 4.2" in result["rocksdb_restore"]
        assert not result["rocksdb_restore_left"]
    else:
        assert result["rocksdb_restore"] == ""
    assert result["transform_with_state"].startswith(
        "InvalidOptionError: [KEYEDSTATE_TRANSFORM_WITH_STATE_PROVIDER] Spark's TransformWithState"
    ), result

    continued = result_of(run_job(INSTALLED, tmp_path, "continue"))
    assert continued["pyspark"].startswith(INSTALLED + ".")
    assert continued["keyed"] == EXPECTED_PHASE_2
    assert continued["aggregation"] == EXPECTED_PHASE_2


@pytest.mark.parametrize("minor", OLDER)
def test_a_jar_of_another_spark_is_refused_naming_both(minor: str, tmp_path: Path) -> None:
    other = Path(PYTHON_SOURCES, "keyedstate", "jars", f"keyedstate-spark-{INSTALLED}.jar")
    done = run_job(minor, tmp_path, env={"KEYEDSTATE_JAR": str(other)})
    assert done.returncode != 0
    assert (
        f"[KEYEDSTATE_UNSUPPORTED_SPARK_VERSION] This keyedstate jar is for Spark {INSTALLED}, "
        f"and Spark {minor}." in done.stderr
    ), done.stderr[-4000:]
    assert f"use keyedstate-spark-{minor}.jar" in done.stderr
