"""The main job: a stateful streaming query on keyedstate's provider, stopped and restarted.

Run with ``make demo`` (or ``python -m keyedstate.tools.demo``). It generates a stream of purchase
events as files, runs a per-user aggregation on local Spark with a local checkpoint folder,
stops the query half-way, restarts it from the checkpoint, stops it again, rescales its state
from 4 to 6 partitions (``keyedstate.rescale``), restarts it on the rescaled checkpoint, and
prints the results, the provider's metrics, and whether the streamed result equals a batch
computation of the same data.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

import keyedstate

SCHEMA = StructType(
    [
        StructField("user", StringType()),
        StructField("category", StringType()),
        StructField("amount", LongType()),
    ]
)
CATEGORIES = ["books", "games", "music", "garden"]


def write_events(folder: Path, first_file: int, files: int, rows: int, rng: random.Random) -> None:
    """One JSON-lines file per micro-batch (the source reads one file per trigger)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(first_file, first_file + files):
        lines = (
            json.dumps(
                {
                    "user": f"user-{rng.randrange(500):03d}",
                    "category": rng.choice(CATEGORIES),
                    "amount": rng.randrange(1, 100),
                }
            )
            for _ in range(rows)
        )
        tmp = folder / f".events-{n:04d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(folder / f"events-{n:04d}.json")


def per_user_totals(events: DataFrame) -> DataFrame:
    return events.groupBy("user").agg(
        F.count("*").alias("purchases"), F.sum("amount").alias("spent")
    )


def run_phase(spark: SparkSession, events_dir: Path, checkpoint: Path, phase: str) -> None:
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(events_dir))
    query = (
        per_user_totals(stream)
        .writeStream.format("memory")
        .queryName("per_user_totals")
        .outputMode("complete")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print(f"\n== {phase}: {len(query.recentProgress)} micro-batches")
    for progress in query.recentProgress:
        print_progress(progress)


def print_progress(progress: dict[str, Any]) -> None:
    for op in progress.get("stateOperators", []):
        m = op.get("customMetrics", {})
        print(
            f"  batch {progress['batchId']:>2}: {op['numRowsTotal']:>4} keys in state, "
            f"{op['numRowsUpdated']:>3} updated, commit {op['commitTimeMs']:>4} ms "
            f"(flush {m.get('keyedstateCommitFlushMs', 0)}, "
            f"checkpoint {m.get('keyedstateCommitCheckpointMs', 0)}, "
            f"upload {m.get('keyedstateCommitUploadMs', 0)}, "
            f"manifest {m.get('keyedstateCommitManifestMs', 0)}), "
            f"uploaded {m.get('keyedstateCommitFilesUploaded', 0)} files / "
            f"{m.get('keyedstateCommitBytesUploaded', 0)} bytes, "
            f"reused {m.get('keyedstateCommitFilesReused', 0)} files, "
            f"load {m.get('keyedstateLoadMs', 0)} ms"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="keyedstate-demo", help="events and checkpoint folder")
    parser.add_argument("--files", type=int, default=6, help="micro-batches per phase")
    parser.add_argument("--rows", type=int, default=2000, help="events per micro-batch")
    args = parser.parse_args(argv)

    workdir = Path(args.workdir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    events_dir, checkpoint = workdir / "events", workdir / "checkpoint"
    rng = random.Random(7)

    spark = (
        keyedstate.configure(
            SparkSession.builder.master("local[2]")
            .appName("keyedstate-demo")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
        )
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(f"keyedstate demo: provider {keyedstate.PROVIDER_CLASS}, checkpoint {checkpoint}")
        write_events(events_dir, 0, args.files, args.rows, rng)
        run_phase(spark, events_dir, checkpoint, "first run")
        print("\n   (query stopped; more events arrive)")
        write_events(events_dir, args.files, args.files, args.rows, rng)
        run_phase(spark, events_dir, checkpoint, "restarted from the checkpoint")

        rescaled = workdir / "checkpoint-6"
        result = keyedstate.rescale(spark, str(checkpoint), 6, str(rescaled))
        print(
            f"\n   (query stopped; state rescaled from {result.from_partitions} to "
            f"{result.to_partitions} partitions: {result.keys} keys in {result.total_ms} ms; "
            "more events arrive)"
        )
        checkpoint = rescaled
        write_events(events_dir, 2 * args.files, args.files, args.rows, rng)
        run_phase(spark, events_dir, checkpoint, "restarted from the rescaled checkpoint")

        streamed = spark.table("per_user_totals")
        print("\n== top users by amount spent")
        for row in streamed.orderBy(F.desc("spent"), "user").limit(5).collect():
            print(f"  {row.user}: {row.purchases} purchases, {row.spent} spent")

        batch = per_user_totals(spark.read.schema(SCHEMA).json(str(events_dir)))
        differences = streamed.exceptAll(batch).count() + batch.exceptAll(streamed).count()
        state = spark.read.format("statestore").load(str(checkpoint))
        partitions = state.select("partition_id").distinct().count()
        print(
            f"\n== {streamed.count()} users; state rows read back from the checkpoint: "
            f"{state.count()} in {partitions} partitions"
        )
        print(f"== streamed result equals the batch computation: {differences == 0}")
        return 0 if differences == 0 else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
