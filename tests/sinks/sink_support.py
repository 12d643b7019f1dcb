"""What the sink tests share: a query run to the end of its input, and a foreachBatch function
that fails right after the sink committed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession


def run(
    spark: SparkSession,
    df: DataFrame,
    write: Any,  # noqa: ANN401 - a foreachBatch function
    checkpoint: Path,
    output_mode: str = "append",
) -> Exception | None:
    """Run ``df`` over all input available now; the query's failure, if any."""
    query = (
        df.writeStream.outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(write)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    except Exception as error:  # the failure is reported by query.exception() too
        del error
    finally:
        if query.isActive:
            query.stop()
    return query.exception()


class FailAfterCommit:
    """foreachBatch: the sink commits, then the batch fails before Spark's commit log is written
    (as a driver dying right after ``what`` committed would), once for each of ``batches``."""

    def __init__(
        self,
        sink: Callable[[DataFrame, int], None],
        batches: Iterable[int],
        what: str = "the sink",
    ) -> None:
        self.sink, self.batches, self.what = sink, set(batches), what

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.sink(df, batch_id)
        if batch_id in self.batches:
            self.batches.discard(batch_id)
            raise RuntimeError(f"injected failure after {self.what} committed batch {batch_id}")
