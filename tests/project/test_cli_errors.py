"""The operations CLI reports a damaged checkpoint in one line and exits 2 (no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import keyedstate
import pytest
from pyspark.sql import SparkSession


def test_inspect_of_a_checkpoint_with_a_missing_file_is_one_line_naming_it_and_the_version(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    spark.range(100).selectExpr("id % 10 as k").write.parquet(str(source))
    checkpoint = tmp_path / "ck"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", keyedstate.PROVIDER_CLASS)
    spark.conf.set(keyedstate.OPTION_PREFIX + "changelogCheckpointing", "false")
    try:
        query = (
            spark.readStream.schema("k long").parquet(str(source)).groupBy("k").count()
            .writeStream.format("noop").outputMode("update")
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )
        query.awaitTermination(180)
    finally:
        spark.conf.unset(keyedstate.OPTION_PREFIX + "changelogCheckpointing")
    files = sorted(checkpoint.glob("state/0/*/shared/*.sst"))
    assert files, "the aggregation wrote no state files"
    files[0].unlink()
    done = subprocess.run(
        [sys.executable, "-m", "keyedstate.tools.cli", "inspect", "--checkpoint", str(checkpoint),
         "--master", "local[1]"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(
        "keyedstate inspect: [KEYEDSTATE_CHECKPOINT_FILE_MISSING] State file "
    ), lines[0]
    assert files[0].name in lines[0] and "version 1 is missing" in lines[0], lines[0]
    # Spark's own output went to a log the line names, kept for the failure.
    log = Path(lines[0].rsplit("(Spark's log: ", 1)[1].rstrip(")"))
    assert "CheckpointFileException" in log.read_text()
    log.unlink()


def test_a_malformed_conf_option_exits_2_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keyedstate.tools.cli", "inspect", "--checkpoint", "/nowhere",
         "--conf", "novalue"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "keyedstate: --conf expects KEY=VALUE, got 'novalue'"


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (["rescale", "--partitions", "0"],
         "keyedstate rescale: [KEYEDSTATE_RESCALE_REFUSED] Invalid partition count 0 for rescale: "
         "allowed is an integer from 1 to 100000"),
        (["inspect", "--key-groups", "0"],
         "keyedstate inspect: [KEYEDSTATE_INVALID_OPTION] Invalid key group count 0 for inspect: "
         "allowed is an integer from 1 to 65536"),
        (["inspect"], "keyedstate inspect: [KEYEDSTATE_QUERY_CHECKPOINT_INVALID] no checkpoint at "
         "file:{missing}"),
    ],
)
def test_what_can_be_refused_before_spark_starts_is_refused_at_once(
    tmp_path: Path, arguments: list[str], line: str
) -> None:
    """A bad count or a local checkpoint that is not there: one line and exit 2 in the time
    Python takes to start, not after Spark's (8-19 s before)."""
    checkpoint = tmp_path if "--partitions" in arguments or "--key-groups" in arguments else None
    missing = tmp_path / "missing"
    done = subprocess.run(
        [sys.executable, "-m", "keyedstate.tools.cli", *arguments,
         "--checkpoint", str(checkpoint or missing)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    # No JVM was started: the line names no log of Spark's.
    assert done.stderr.strip() == line.format(missing=missing), done.stderr[-2000:]


def test_the_tools_word_a_missing_checkpoint_and_a_bad_count_alike(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Through the Python API (no CLI checks before the JVM's): the same identifiers and words."""
    missing = tmp_path / "missing"
    for call in (
        lambda: keyedstate.inspect(spark, str(missing)),
        lambda: keyedstate.state.read(spark, str(missing), state="count"),
        lambda: keyedstate.rescale(spark, str(missing), 3),
    ):
        with pytest.raises(keyedstate.QueryCheckpointError) as failure:
            call()
        assert str(failure.value) == (
            f"[KEYEDSTATE_QUERY_CHECKPOINT_INVALID] no checkpoint at file:{missing}"
        ), failure.value
    tmp_path.joinpath("empty").mkdir()
    bad_count = (
        r"^\[KEYEDSTATE_INVALID_OPTION\] Invalid key group count 0 for inspect: allowed is an "
        r"integer from 1 to 65536$"
    )
    with pytest.raises(keyedstate.InvalidOptionError, match=bad_count):
        keyedstate.inspect(spark, str(tmp_path / "empty"), key_groups=0)


def test_savepoint_commands_report_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-savepoint"
    missing.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "keyedstate.tools.cli", "savepoint", "inspect",
         "--savepoint", str(missing), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]
    said = "keyedstate savepoint: [KEYEDSTATE_CHECKPOINT_FILE_MISSING] No savepoint at "
    assert lines[0].startswith(f"{said}file:{missing}: "), lines[0]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["savepoint", "create", "--checkpoint", "/c", "--target", "/t", "--format", "binary"],
         "keyedstate savepoint create: argument --format: invalid choice: 'binary'"),
        (["rescale", "--checkpoint", "/c"],
         "keyedstate rescale: the following arguments are required: --partitions"),
        (["savepoint"], "keyedstate savepoint: the following arguments are required: action"),
        (["inspect", "--checkpoint", "/c", "--prority", "normal"],
         "keyedstate: unrecognized arguments: --prority normal"),
        (["jar", "--spark-version", "3.5.1"],
         "keyedstate jar: keyedstate has provider jars for Spark 4.0, 4.1, 4.2 and 4.3, not for "
         "Spark 3.5.1: run the cluster on one of those"),
    ],
)
def test_a_refused_argument_is_one_line_without_usage(argv: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keyedstate.tools.cli", *argv],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(said), done.stderr


def test_the_tools_run_at_low_cpu_priority_unless_told(tmp_path: Path) -> None:
    """A savepoint or an inspect beside a running query takes only the CPU the query leaves:
    the command and the JVM it starts run at the lowest priority, unless --priority normal."""
    script = (
        "import os, sys\n"
        "from keyedstate.tools import cli\n"
        "code = cli.main(sys.argv[1:])\n"
        "print(code, os.nice(0))\n"
    )
    import os

    for extra, niceness in (([], 19), (["--priority", "normal"], os.nice(0))):
        done = subprocess.run(
            [sys.executable, "-c", script, "savepoint", "list", "--dir", str(tmp_path),
             "--master", "local[1]", *extra],
            capture_output=True, text=True, timeout=300,
        )
        assert done.stdout.split()[-2:] == ["0", str(niceness)], done.stdout + done.stderr[-2000:]
