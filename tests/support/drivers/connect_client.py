"""A Spark Connect client for tests/engine/test_connect.py: runs one phase of
tests/support/connect_scenarios.py on the Spark Connect server at URL; with ``--uid-change``,
then restarts a keyed function under another uid, which keyedstate refuses, and reports the
error as ``keyedstate.errors.state_error`` maps it. Prints one JSON line ``SUMMARY {...}``.

usage: connect_client.py URL ROOT [--uid-change] [--operations]
       connect_client.py URL ROOT --client-version VERSION

``--client-version``: only plans a keyed function as a client of keyedstate VERSION would, and
reports the error.

``--operations``: then the offline operations (``connect_scenarios.run_operations``), their
results in the summary.
"""

from __future__ import annotations

import script_paths  # noqa: F401 - first: puts the repository and the package on sys.path

# isort: split

import json
import sys
from pathlib import Path

import keyedstate
from pyspark.sql import SparkSession

from tests.support.connect_scenarios import GroupCount, run_operations, run_phase


def uid_change(spark: SparkSession, root: Path) -> dict[str, str | None]:
    """A keyed function run under uid ``one``, then on the same checkpoint under ``two``."""
    source = root / "uid-change" / "input"
    source.mkdir(parents=True)
    for n, uid in enumerate(("one", "two")):
        (source / f"{n}.json").write_text('{"k": "a", "count": 1}\n')
        stream = spark.readStream.schema("k string, count long").json(str(source))
        frame = keyedstate.key_by(stream, "k").process(
            GroupCount(), "k string, count long, rows long", uid=uid
        )
        query = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", str(root / "uid-change" / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
        except Exception as failure:  # noqa: BLE001 - what a Connect client gets, reported
            mapped = keyedstate.errors.state_error(failure)
            return {
                "raised": type(failure).__module__ + "." + type(failure).__name__,
                "class": None if mapped is None else type(mapped).__name__,
                "error_id": None if mapped is None else mapped.error_id,
            }
    return {"raised": None, "class": None, "error_id": None}


def other_version(spark: SparkSession, root: Path, version: str) -> dict[str, str | None]:
    """A keyed function planned by a client that says it is keyedstate ``version``."""
    from keyedstate.spark_connect import relations

    relations.__version__ = version
    (root / "other-version").mkdir(parents=True, exist_ok=True)
    stream = spark.readStream.schema("k string, count long").json(str(root / "other-version"))
    try:
        keyedstate.key_by(stream, "k").process(GroupCount(), "k string, count long, rows long")
    except Exception as error:  # noqa: BLE001 - what the client gets, reported
        return {
            "class": type(error).__name__,
            "error_id": getattr(error, "error_id", None),
            "message": str(error),
        }
    return {"class": None, "error_id": None, "message": None}


def main() -> None:
    url, root = sys.argv[1], Path(sys.argv[2])
    spark = keyedstate.configure(SparkSession.builder.remote(url)).getOrCreate()
    if "--client-version" in sys.argv[3:]:
        version = sys.argv[sys.argv.index("--client-version") + 1]
        print("SUMMARY " + json.dumps({"other_version": other_version(spark, root, version)}))
        spark.stop()
        return
    run_phase(spark, root)
    summary: dict[str, object] = {"session": type(spark).__module__}
    if "--uid-change" in sys.argv[3:]:
        summary["uid_change"] = uid_change(spark, root)
    if "--operations" in sys.argv[3:]:
        summary["operations"] = run_operations(spark, root)
    print("SUMMARY " + json.dumps(summary), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
