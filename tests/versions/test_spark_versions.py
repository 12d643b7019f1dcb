"""keyedstate on each Spark version it builds for, as a user installs it (docs/architecture.md,
"Spark versions"): this checkout's wheel, which carries the jar ``make jars`` built for each
version, pip-installed into a virtualenv per version that held only that pyspark from PyPI
(``make spark-venvs``: build/venv-spark-<minor>/), pip resolving its other dependencies.

On each version (tests/support/drivers/spark_version_job.py), on keyedstate's provider, each across
restarts, with the rows computed here: a keyed function with value state, a TTL and event-time
timers, killed (SIGKILL, driver and JVM) after a batch committed its state but not the batch, then
restarted; one query per stateful operator a custom provider serves (aggregation,
``dropDuplicates``, ``dropDuplicatesWithinWatermark``, a stream-stream join,
``applyInPandasWithState``, a session window), the aggregation also through keyedstate's
exactly-once PostgreSQL and Kafka sinks (the topic read back by that version's Kafka source). Then
the keyed function's state reads back, is inspected, and its checkpoint is rescaled from 2 to 3
partitions; the provider's metrics are in the progress; a canonical savepoint restores into Spark's
HDFS-backed provider and continues there, and into Spark's RocksDB provider where that Spark can
open an empty store at a batch (4.2+); Spark's ``transformWithStateInPandas`` is refused on
keyedstate's provider. Every checkpoint then continues on the installed Spark: a checkpoint written
by one version is read by another. The jar for another Spark version is refused at the session's
start naming both versions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from keyedstate._session import KAFKA_CONNECTOR_VERSIONS, SUPPORTED_SPARK, spark_minor

from tests.support.drivers.spark_version_job import PHASES
from tests.support.paths import DRIVERS, PYTHON_SOURCES, REPO, makefile_words
from tests.support.streaming_harness import kill_process_group

JOB = DRIVERS / "spark_version_job.py"
INSTALLED = spark_minor()
OLDER = [minor for minor in SUPPORTED_SPARK if minor != INSTALLED]


def join_rows(phase: int) -> list[list[Any]]:
    """The stream-stream join's rows of ``phase``: every pair of elements of one key (of the
    input joined with itself) whose later element came in that phase."""
    seen = [(k, n, p) for p in range(phase + 1) for k, n, _ in PHASES[p]]
    return sorted(
        [k, n, m] for k, n, p in seen for j, m, q in seen if k == j and max(p, q) == phase
    )


# Each query's micro-batches with rows, per phase (spark_version_job.PHASES: a restart between).
EXPECTED: dict[str, list[list[list[list[Any]]]]] = {
    # (key, kind, time in ms, total, TTL'd state there): timers fire in a no-data batch once
    # the watermark passed them (one registered before a restart after it, 31000), and the
    # 1 ms TTL lets only a later element of the same batch see the state.
    "keyed": [
        [
            [
                ["a", "element", 10000, 1, False],
                ["a", "element", 30000, 4, True],
                ["b", "element", 20000, 2, False],
            ],
            [["a", "timer", 11000, 4, False], ["b", "timer", 21000, 2, False]],
        ],
        [
            [["a", "element", 100000, 14, False], ["c", "element", 110000, 1, False]],
            [["a", "timer", 31000, 14, False], ["a", "timer", 101000, 14, False]],
        ],
        [
            [["a", "element", 200000, 114, False], ["b", "element", 210000, 7, False]],
            [["a", "timer", 201000, 114, False], ["c", "timer", 111000, 1, False]],
        ],
    ],
    "aggregation": [[[["a", 4], ["b", 2]]], [[["a", 14], ["c", 1]]], [[["a", 114], ["b", 7]]]],
    "dedup": [[[["a"], ["b"]]], [[["c"]]], []],
    # A key is new again once the watermark (4 s behind) passed its first time + 4 s: "a" at 100 s
    # (first 10 s) and at 200 s (first 100 s), "b" at 210 s; "c" stays a key seen.
    "dedup_within_watermark": [[[["a"], ["b"]]], [[["a"], ["c"]]], [[["a"], ["b"]]]],
    "join": [[join_rows(0)], [join_rows(1)], [join_rows(2)]],
    "pandas_state": [[[["a", 2], ["b", 1]]], [[["a", 3], ["c", 1]]], [[["a", 4], ["b", 2]]]],
    # (key, session start in s, sum), emitted once the watermark passed the session's end.
    "session": [
        [[["a", 10, 1], ["b", 20, 2]]],
        [[["a", 30, 3], ["a", 100, 10]]],
        [[["a", 200, 100], ["c", 110, 1]]],
    ],
}
EXPECTED_STATE = [["a", 14], ["b", 2], ["c", 1]]
# The aggregation's PostgreSQL table after each phase (upserts: a key's last total).
EXPECTED_TABLE = [
    [("a", 4), ("b", 2)],
    [("a", 14), ("b", 2), ("c", 1)],
    [("a", 114), ("b", 7), ("c", 1)],
]
# Its Kafka topic after each phase: every update once (read_committed), phase after phase.
EXPECTED_TOPIC = [
    sorted((k, v) for batches in EXPECTED["aggregation"][: p + 1] for k, v in batches[0])
    for p in range(3)
]

pytestmark = pytest.mark.timeout(600)

# The pyspark release of each version's virtualenv (the Makefile's OLDER_SPARK and NEWEST_SPARK).
RELEASES = {
    spark_minor(release): release
    for name in ("OLDER_SPARK", "NEWEST_SPARK")
    for release in makefile_words(name)
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel: every Spark version's jar in it (or the build refuses), and the
    pyspark range of the supported versions."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("keyedstate-*.whl")
    with zipfile.ZipFile(built) as archive:
        jars = sorted(n for n in archive.namelist() if n.startswith("keyedstate/jars/"))
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = archive.read(metadata).decode()
    assert jars == [f"keyedstate/jars/keyedstate-spark-{m}.jar" for m in SUPPORTED_SPARK], jars
    next_minor = f"4.{int(SUPPORTED_SPARK[-1].split('.')[1]) + 1}"
    assert f"Requires-Dist: pyspark<{next_minor},>={SUPPORTED_SPARK[0]}" in requires, requires
    return built


def venv_python(minor: str) -> Path:
    python = REPO / "build" / f"venv-spark-{minor}" / "bin" / "python"
    assert python.exists(), f"{python} is missing: `make spark-venvs` makes it"
    return python


_installed: set[str] = set()


def install(minor: str, wheel: Path) -> None:
    """The wheel pip-installed into Spark ``minor``'s virtualenv as a user installs it: pip
    checks its pyspark range against the version there and resolves its other dependencies."""
    if minor in _installed:
        return
    pip = [str(venv_python(minor)), "-m", "pip"]
    subprocess.run([*pip, "uninstall", "-q", "-y", "keyedstate"], check=True, timeout=120)
    done = subprocess.run(
        [*pip, "install", "-q", "--disable-pip-version-check", f"{wheel}[postgres]"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    _installed.add(minor)


def sink_table(server: Any, workdir: Path, name: str) -> str:  # noqa: ANN401 - a PostgresServer
    """An empty table for the job's PostgreSQL sink, named in the work folder for the job."""
    import psycopg

    with psycopg.connect(**server.params(), autocommit=True) as db:
        db.execute(f"DROP TABLE IF EXISTS {name}")
        db.execute(f"CREATE TABLE {name} (k text PRIMARY KEY, total bigint NOT NULL)")
    (workdir / "sink-table").write_text(name)
    return name


def table_rows(server: Any, name: str) -> list[tuple[str, int]]:  # noqa: ANN401
    import psycopg

    with psycopg.connect(**server.params()) as db:
        return [tuple(r) for r in db.execute(f"SELECT k, total FROM {name} ORDER BY k")]


def sink_topic(broker: Any, workdir: Path, name: str) -> str:  # noqa: ANN401 - a KafkaBroker
    """A new topic for the job's Kafka sink, named in the work folder for the job."""
    topic = broker.create_topic(f"{name}-{uuid.uuid4().hex[:8]}", partitions=2)
    (workdir / "sink-topic").write_text(topic)
    return topic


def topic_records(broker: Any, topic: str) -> list[tuple[str, int]]:  # noqa: ANN401
    """What a read_committed reader of ``topic`` sees, sorted."""
    return sorted((k.decode(), int(v.decode())) for _, k, v in broker.read(topic, "read_committed"))


def kafka_connector_jars(minor: str) -> list[Path]:
    """Spark ``minor``'s Kafka connector (`make connectors`): build/connectors/spark-kafka-<minor>/,
    and the installed Spark's in build/connectors/spark-kafka/."""
    folder = (
        REPO
        / "build"
        / "connectors"
        / ("spark-kafka" if minor == INSTALLED else f"spark-kafka-{minor}")
    )
    jars = sorted(folder.glob("*.jar"))
    assert jars, f"{folder} has no jars: `make connectors` fetches them"
    return jars


def run_job(
    minor: str,
    *workdirs: Path,
    step: str = "write",
    env: dict[str, str] | None = None,
    site: Path | None = None,
    postgres: Any = None,  # noqa: ANN401 - a PostgresServer
    kafka: Any = None,  # noqa: ANN401 - a KafkaBroker
) -> subprocess.CompletedProcess[str]:
    """The job's ``step`` on ``workdirs`` in Spark ``minor``'s virtualenv (with the keyedstate
    installed there, or the one at ``site``), in a process group of its own (the crash step
    kills its group); returns once nothing of the group is left."""
    python = venv_python(minor)
    paths = {"PYTHONPATH": str(site)} if site else {}
    if postgres is not None:
        paths["SINK_POSTGRES"] = json.dumps(postgres.params())
    if kafka is not None:
        paths["SINK_KAFKA"] = kafka.bootstrap_servers
        paths["SPARK_JOB_JARS"] = ",".join(map(str, kafka_connector_jars(minor)))
    job = subprocess.Popen(
        [str(python), str(JOB), step, *map(str, workdirs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(
            os.environ,
            **paths,
            PYSPARK_PYTHON=str(python),
            PYSPARK_DRIVER_PYTHON=str(python),
            **(env or {}),
        ),
    )
    try:
        stdout, stderr = job.communicate(timeout=540)
    finally:
        kill_process_group(job)  # the JVM of a killed driver too, before the next step starts
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


def test_the_kafka_connector_fetched_for_each_older_spark_is_the_one_configure_adds() -> None:
    assert {spark_minor(v): v for v in makefile_words("OLDER_SPARK_KAFKA")} == {
        minor: KAFKA_CONNECTOR_VERSIONS[minor] for minor in OLDER
    }


def test_an_older_spark_is_built_for() -> None:
    assert OLDER, f"keyedstate supports {SUPPORTED_SPARK} only: nothing older than {INSTALLED}"


def result_of(done: subprocess.CompletedProcess[str], killed: bool = False) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    expected_code = -signal.SIGKILL if killed else 0
    assert done.returncode == expected_code and lines, (done.returncode, done.stderr[-4000:])
    return json.loads(lines[-1].removeprefix("RESULT "))


def phase_of(result: dict[str, Any], phase: int, what: str = "") -> None:
    for name, phases in EXPECTED.items():
        assert result[name] == phases[phase], (what, name, phase, result[name])


# The work folder of each older version's run, continued on the installed Spark after them all.
WRITTEN: dict[str, Path] = {}


@pytest.mark.parametrize("minor", OLDER)
def test_state_on_an_older_spark(
    minor: str, tmp_path: Path, wheel: Path, postgres_server: Any, kafka_broker: Any
) -> None:
    install(minor, wheel)
    table = sink_table(postgres_server, tmp_path, f"totals_{minor.replace('.', '_')}")
    topic = sink_topic(kafka_broker, tmp_path, f"totals-{minor}")
    sinks = {"postgres": postgres_server, "kafka": kafka_broker}
    killed = run_job(minor, tmp_path, step="crash", **sinks)
    crashed = result_of(killed, killed=True)
    # Killed with the batch's state committed in both partitions, and the batch not.
    (line,) = [line for line in killed.stdout.splitlines() if line.startswith("KILLED ")]
    assert json.loads(line.removeprefix("KILLED ")) == {
        "state_versions": ["0", "1"],
        "batch_committed": False,
    }
    assert crashed["pyspark"] == RELEASES[minor], crashed["pyspark"]
    jar = Path(crashed["jar"])  # the installed package's, for this Spark
    assert jar.name == f"keyedstate-spark-{minor}.jar" and "site-packages" in jar.parts, jar
    assert jar.is_relative_to(venv_python(minor).parent.parent), jar
    phase_of(crashed, 0)

    assert table_rows(postgres_server, table) == EXPECTED_TABLE[0]
    assert topic_records(kafka_broker, topic) == EXPECTED_TOPIC[0]
    result = result_of(run_job(minor, tmp_path, **sinks))
    assert table_rows(postgres_server, table) == EXPECTED_TABLE[1]
    assert topic_records(kafka_broker, topic) == EXPECTED_TOPIC[1]
    assert [tuple(r) for r in result["kafka_read"]] == EXPECTED_TOPIC[1]  # Spark's Kafka source
    phase_of(result, 1)  # the keyed function's killed batch ran again, from its state before it
    assert result["read"] == EXPECTED_STATE
    inspected = result["inspected"]
    assert inspected["partitions"] == 2 and inspected["keys"] > 0, inspected
    assert [f.rsplit(".", 1)[-1] for f in inspected["functions"]] == ["TimedTotal"], inspected
    assert result["rescaled"] == [2, 3]
    assert {"keyedstateCommitFlushMs", "keyedstateSstFilesBytes"} <= set(result["metrics"]), result[
        "metrics"
    ]
    # Spark's HDFS-backed provider, restored into at batch 1 and continued (on 4.0 and 4.1 from
    # the delta it wrote: no forceSnapshotOnCommit before 4.2).
    assert result["hdfs_restored"] == EXPECTED["aggregation"][2]
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

    WRITTEN[minor] = tmp_path


def test_the_older_versions_checkpoints_continue_on_the_installed_spark(
    wheel: Path, postgres_server: Any, kafka_broker: Any
) -> None:
    """Every checkpoint each older version wrote, continued by the installed Spark in one run
    (a JVM started once), from the wheel installed in its virtualenv."""
    if not WRITTEN:
        pytest.skip("continues what test_state_on_an_older_spark wrote: run them together")
    assert sorted(WRITTEN) == OLDER, f"the runs of {sorted(set(OLDER) - set(WRITTEN))} failed above"
    install(INSTALLED, wheel)
    done = run_job(
        INSTALLED, *WRITTEN.values(), step="continue", postgres=postgres_server, kafka=kafka_broker
    )
    continued = result_of(done)
    assert continued["pyspark"] == RELEASES[INSTALLED], continued["pyspark"]
    for minor, workdir in WRITTEN.items():
        # The keyed function on the 3 partitions it was rescaled to.
        phase_of(continued["runs"][str(workdir)], 2, f"written by Spark {minor}")
        table = (workdir / "sink-table").read_text().strip()
        assert table_rows(postgres_server, table) == EXPECTED_TABLE[2], minor
        topic = (workdir / "sink-topic").read_text().strip()
        assert topic_records(kafka_broker, topic) == EXPECTED_TOPIC[2], minor


@pytest.mark.parametrize("minor", OLDER)
def test_a_jar_of_another_spark_is_refused_naming_both(
    minor: str, tmp_path: Path, wheel: Path
) -> None:
    install(minor, wheel)  # the package's dependencies; the checkout's sources are run
    other = Path(PYTHON_SOURCES, "keyedstate", "jars", f"keyedstate-spark-{INSTALLED}.jar")
    done = run_job(minor, tmp_path, env={"KEYEDSTATE_JAR": str(other)}, site=PYTHON_SOURCES)
    assert done.returncode != 0
    assert (
        f"[KEYEDSTATE_UNSUPPORTED_SPARK_VERSION] This keyedstate jar is for Spark {INSTALLED}, "
        f"and Spark {minor}." in done.stderr
    ), done.stderr[-4000:]
    assert f"use keyedstate-spark-{minor}.jar" in done.stderr
