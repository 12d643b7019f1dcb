"""The Flink tutorial examples (keyedstate.examples) on real streaming queries.

Each example runs in two phases over one checkpoint (the second restarts the query, so state
written before the restart must be read back) on keyedstate's provider and on Spark's RocksDB
provider. The per-batch outputs must equal what the listing computes in plain Python.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from keyedstate import examples
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.support.state_api_support import PROVIDERS, run_jobs
from tests.support.streaming_harness import diff_batches, sort_rows

PAIR_FILES = [
    [{"key": 2, "value": 21}, {"key": 4, "value": 1}, {"key": 5, "value": 4}],
    [
        {"key": 2, "value": 3},
        {"key": 4, "value": 7},
        {"key": 2, "value": 30},
        {"key": 7, "value": 9},
    ],
    [{"key": 5, "value": 2}, {"key": 2, "value": 1}, {"key": 7, "value": 12}],
    [
        {"key": 4, "value": 0},
        {"key": 5, "value": 5},
        {"key": 9, "value": 6},
        {"key": 2, "value": 8},
    ],
]
READING_FILES = [
    [{"id": "s1", "temperature": 20.0}, {"id": "s2", "temperature": 15.0}],
    [
        {"id": "s1", "temperature": 21.0},
        {"id": "s1", "temperature": 23.5},
        {"id": "s3", "temperature": 5.0},
    ],
    [
        {"id": "s2", "temperature": 14.0},
        {"id": "s2", "temperature": 11.0},
        {"id": "s3", "temperature": 4.5},
    ],
    [
        {"id": "s1", "temperature": 21.5},
        {"id": "s3", "temperature": 9.0},
        {"id": "s2", "temperature": 11.5},
    ],
]
PHASES = [
    {"pairs": PAIR_FILES[:2], "readings": READING_FILES[:2]},
    {"pairs": PAIR_FILES[2:], "readings": READING_FILES[2:]},
]


def expected(partition_of: dict[int, int]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Per example, per batch: what each listing computes, in plain Python.

    A micro-batch is processed key by key (a key's elements in arrival order, keys in key order
    within a partition), which only the operator state of ``CheckpointCount`` can observe."""
    least: dict[int, int] = {}
    sums: dict[int, int] = {}
    keyed_counts: dict[int, int] = defaultdict(int)
    operator_counts: dict[int, int] = defaultdict(int)
    last_temp: dict[str, float] = {}
    out: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(dict)
    for batch, rows in enumerate(PAIR_FILES):
        minimum, running, counts = [], [], []
        for row in sorted(rows, key=lambda r: (partition_of[r["key"]], r["key"])):
            key, value = row["key"], row["value"]
            if key in least and value > least[key]:
                minimum.append({"key": key, "value": value, "least": least[key]})
            else:
                least[key] = value
                minimum.append({"key": key, "value": value, "least": value})
            running.append({"key": key, "count": sums.get(key, 0)})
            sums[key] = sums.get(key, 0) + value
            keyed_counts[key] += 1
            operator_counts[partition_of[key]] += 1
            counts.append(
                {
                    "key": key,
                    "keyed_count": keyed_counts[key],
                    "operator_count": operator_counts[partition_of[key]],
                }
            )
        out["minimum"][batch] = sort_rows(minimum)
        out["running_count"][batch] = sort_rows(running)
        out["checkpoint_count"][batch] = sort_rows(counts)
    for batch, rows in enumerate(READING_FILES):
        alerts = []
        for row in rows:
            sensor, temperature = row["id"], row["temperature"]
            if sensor in last_temp and abs(temperature - last_temp[sensor]) > 1.7:
                diff = abs(temperature - last_temp[sensor])
                alerts.append({"id": sensor, "temperature": temperature, "diff": diff})
            last_temp[sensor] = temperature
        out["alert"][batch] = sort_rows(alerts)
        out["alert_with_state"][batch] = sort_rows(alerts)
    return out


def test_tutorial_examples_across_a_restart(spark: SparkSession, tmp_path: Path) -> None:
    names = ["minimum", "running_count", "checkpoint_count", "alert", "alert_with_state"]
    jobs = {
        f"{name}-{label}": (
            provider,
            lambda frames, name=name: examples.build_all(
                frames["pairs"], frames["readings"]
            )[name],
        )
        for name in names
        for label, provider in PROVIDERS.items()
    }
    results = run_jobs(
        spark, tmp_path, {"pairs": examples.PAIRS, "readings": examples.READINGS}, PHASES, jobs
    )
    keys = sorted({row["key"] for rows in PAIR_FILES for row in rows})
    # Operator state is per state partition: Spark's partitioning of the key.
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    frame = spark.createDataFrame([(k,) for k in keys], "k bigint")
    owner = F.pmod(F.hash(F.col("k")), F.lit(partitions)).alias("p")
    partition_of = {r["k"]: r["p"] for r in frame.select("k", owner).collect()}
    # The scenario needs keys sharing a partition and not.
    assert 1 < len(set(partition_of.values())) < len(keys), partition_of
    want = expected(partition_of)
    for job, result in results.items():
        name = job.rsplit("-", 1)[0]
        assert result.batches == want[name], f"{job}:\n" + diff_batches(want[name], result.batches)
    # Readings from before the restart were used after it (batches 2 and 3 alert).
    assert want["alert"][2] and want["alert"][3]
