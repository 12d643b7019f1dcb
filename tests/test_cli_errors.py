"""The operations CLI reports a damaged checkpoint in one line and exits 2 (no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import keyedstate
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
