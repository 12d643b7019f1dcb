"""What the Python API benchmarks share: a session, checkpoint bytes per micro-batch, timing."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import keyedstate  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"


def session(
    app: str, partitions: int, memory: str = "6g", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A local[2] session through keyedstate.configure; ``conf`` adds settings read only at
    start (``spark.hadoop.*``; ``spark.jars`` is added to keyedstate's jar)."""
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", memory)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.files.openCostInBytes", str(1 << 30))  # one input file per partition
    )
    builder = keyedstate.configure(builder)
    for key, value in (conf or {}).items():
        if key == "spark.jars":
            value = ",".join([str(builder._options["spark.jars"]), value])
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class WrittenBytes:
    """Bytes of files written under a directory since the last call (new or changed files),
    so deleted files (retention) do not cancel written ones."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: dict[str, tuple[int, int]] = {}

    def delta(self) -> int:
        written = 0
        for path in self.root.rglob("*"):
            if not path.is_file():
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue  # deleted by retention meanwhile
            key = str(path)
            signature = (stat.st_size, stat.st_mtime_ns)
            if self.seen.get(key) != signature:
                written += stat.st_size
                self.seen[key] = signature
        return written


@dataclass
class BatchLog:
    """Per micro-batch: the state bytes written and the trigger's duration."""

    bytes: dict[int, int] = field(default_factory=dict)
    duration_ms: dict[int, int] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)


def run_batches(
    spark: SparkSession,
    frame: DataFrame,
    provider: str,
    checkpoint: Path,
    check: Callable[[int, list[Any]], None] | None = None,
    timeout_s: float = 7200,
) -> BatchLog:
    """Runs ``frame`` with availableNow until its input is consumed; per batch, counts its output
    and the state bytes written (measured in the sink, after the batch's state commits)."""
    spark.conf.set(PROVIDER_KEY, provider)
    log = BatchLog()
    written = WrittenBytes(checkpoint / "state")

    def sink(df: DataFrame, batch_id: int) -> None:
        if check is None:
            log.rows[batch_id] = df.count()
        else:
            rows = df.collect()
            log.rows[batch_id] = len(rows)
            check(batch_id, rows)
        log.bytes[batch_id] = written.delta()

    query = (
        frame.writeStream.outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(timeout_s):
        query.stop()
        raise RuntimeError(f"query on {checkpoint} did not finish in {timeout_s}s")
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    for progress in query.recentProgress:
        log.duration_ms[progress.batchId] = progress.durationMs.get("triggerExecution", 0)
    return log


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if not ordered:
        return float("nan")
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f}"
