"""A class-data-sharing archive of the Spark driver's classes, for the JVMs the tests start.

Every Spark JVM the tests start (a driver process, a CLI command, the Spark Connect server, a
standalone cluster's master, workers and executors) loads and verifies some thousands of Spark's
classes from jars: about 9 s to a SparkSession on this machine's two cores, of which the archive
saves about 4 (the kill-and-restart tests: 217 s without it, 158 s with it). JDK 17's dynamic
archive (``-XX:ArchiveClassesAtExit``) is written once per machine, for the installed pyspark and
JDK, by a small session that runs a batch job and a streaming aggregation
(build/jvm-class-archive/);
``spark-submit`` hands ``SPARK_SUBMIT_OPTS`` to every driver JVM, and ``spark-class`` hands
``SPARK_DAEMON_JAVA_OPTS`` to a standalone cluster's master and workers, and its executors take
``spark.executor.extraJavaOptions`` from their application's session. A JVM whose class path
differs from the archive's (a driver with ``spark.driver.extraClassPath``) runs without it; the
logging options keep the JVM from saying so on its output, which some tests read.

Nothing the tests check depends on it: with ``KEYEDSTATE_TEST_CLASS_ARCHIVE=0``, or where the
archive cannot be written (tried once per machine: a ``.failed`` file beside it says why), the
JVMs load their classes from the jars as usual.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pyspark

from tests.support.paths import PYTHON_SOURCES, REPO

ARCHIVES = REPO / "build" / "jvm-class-archive"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
SWITCH_ENV = "KEYEDSTATE_TEST_CLASS_ARCHIVE"
# The options for a standalone cluster's executors, which a worker starts with the application's
# spark.executor.extraJavaOptions (servers/spark_standalone.py's job_builder sets them).
EXECUTOR_OPTIONS_ENV = "KEYEDSTATE_TEST_EXECUTOR_JAVA_OPTIONS"

# The workload whose classes are archived: a session as the tests make one, a batch job and a
# streaming aggregation on keyedstate's provider.
_WORKLOAD = textwrap.dedent(
    """
    import sys, tempfile
    from pathlib import Path
    import keyedstate
    from pyspark.sql import SparkSession, functions as F

    spark = keyedstate.configure(
        SparkSession.builder.master("local[2]").appName("class-archive")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
    ).getOrCreate()
    spark.range(1000).groupBy((F.col("id") % 7).alias("k")).count().collect()
    root = Path(tempfile.mkdtemp())
    (root / "in").mkdir()
    (root / "in" / "a.json").write_text('{"k": "a", "v": 1}\\n{"k": "b", "v": 2}\\n')
    query = (
        spark.readStream.schema("k string, v long").json(str(root / "in"))
        .groupBy("k").agg(F.sum("v").alias("total"))
        .writeStream.outputMode("update").format("memory").queryName("totals")
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    assert spark.table("totals").count() == 2
    spark.stop()
    """
)


def _java_version() -> str:
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if "JAVA_HOME" in os.environ else "java"
    done = subprocess.run(
        [str(java), "-version"], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stderr


def archive_path() -> Path:
    """The archive for this JDK and this pyspark's jars (their folder, names, sizes and times):
    a new one when any changes, as the JVM would pass over the old one."""
    jars = (Path(pyspark.__file__).parent / "jars").resolve()
    listing = sorted(
        f"{jar.name}:{jar.stat().st_size}:{jar.stat().st_mtime_ns}" for jar in jars.glob("*.jar")
    )
    text = "\n".join([_java_version(), str(jars), *listing])
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return ARCHIVES / f"spark-{pyspark.__version__}-{key}.jsa"


def _write(archive: Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=archive.parent))
    env = dict(
        os.environ,
        SPARK_SUBMIT_OPTS=f"-XX:ArchiveClassesAtExit={staging / archive.name} {QUIET}",
        PYTHONPATH=os.pathsep.join([str(PYTHON_SOURCES), os.environ.get("PYTHONPATH", "")]),
    )
    try:
        subprocess.run(
            [sys.executable, "-c", _WORKLOAD], env=env, capture_output=True, timeout=600, check=True
        )
        os.replace(staging / archive.name, archive)  # whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def use_for_spark_jvms() -> str:
    """Writes the archive if this machine has none yet, and hands it to the Spark JVMs this
    process and its children start (through the environment). Returns a line for the report."""
    if os.environ.get(SWITCH_ENV) == "0":
        return f"off ({SWITCH_ENV}=0)"
    try:
        archive = archive_path()
        failed = archive.with_suffix(".failed")  # tried once on this machine: not at every run
        if failed.exists():
            return f"none: writing it failed before ({failed}; delete it to try again)"
        started = time.monotonic()
        built = ""
        if not archive.exists():
            try:
                _write(archive)
            except (OSError, subprocess.SubprocessError) as error:
                failed.write_text(f"{type(error).__name__}: {error}\n")
                raise
            built = f", written in {time.monotonic() - started:.0f} s"
    except (OSError, subprocess.SubprocessError) as error:
        return f"none: {type(error).__name__}: {str(error)[:200]}"
    options = f"-XX:SharedArchiveFile={archive} {QUIET}"
    for variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS", EXECUTOR_OPTIONS_ENV):
        os.environ[variable] = f"{os.environ.get(variable, '')} {options}".strip()
    return f"{archive.relative_to(REPO)}{built}"
