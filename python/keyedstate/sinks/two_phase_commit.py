"""Flink's ``TwoPhaseCommitSinkFunction`` for Spark micro-batches.

A micro-batch plays the part of Flink's checkpoint: Spark replays a batch whose commit-log entry
is missing (a failure, a driver killed after the sink wrote), so a sink is exactly once when each
batch's output becomes visible in one transaction and a replay of a committed batch is skipped.
A subclass says how (``begin_transaction``, ``invoke``, ``pre_commit``, ``commit``, ``abort``)
and how to tell a batch already committed (``is_committed``); ``TwoPhaseCommitSink.__call__``
drives them, so an instance is a ``foreachBatch`` function::

    df.writeStream.foreachBatch(MySink(...)).option("checkpointLocation", ...).start()

``scope`` picks where transactions run: ``TransactionScope.BATCH`` (one transaction for the whole
micro-batch, on the driver, rows streamed with ``toLocalIterator``) or
``TransactionScope.PARTITION`` (one per partition of the batch, on the executors; the sink is
pickled to them). See docs/exactly-once.md, "Writing your own two-phase-commit sink".
"""

from __future__ import annotations

import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from keyedstate.errors import BatchAlreadyCommitted, SuppressRestartsException
from keyedstate.spark_connect import is_connect

if TYPE_CHECKING:  # pyspark is only needed once a batch is written
    from pyspark.sql import DataFrame, Row

__all__ = [
    "QUERY_ID_PROPERTY",
    "BatchAlreadyCommitted",
    "TransactionContext",
    "TransactionScope",
    "TwoPhaseCommitSink",
    "WriteOutcome",
]

LOG = logging.getLogger(__name__)

# Spark sets this local property on the thread that runs a streaming query's batches to the
# query's id, which the checkpoint keeps across restarts (unlike the run id).
QUERY_ID_PROPERTY = "sql.streaming.queryId"

TXN = TypeVar("TXN")


@dataclass(frozen=True)
class TransactionContext:
    """One transaction's identity: the same on every replay of the same batch (and partition)."""

    sink_id: str  # stable across restarts (query id from the checkpoint, or a user name)
    batch_id: int
    partition_id: int | None  # None: one transaction for the whole micro-batch (driver side)

    def __str__(self) -> str:
        where = "" if self.partition_id is None else f" partition {self.partition_id}"
        return f"sink {self.sink_id} batch {self.batch_id}{where}"


class TransactionScope(enum.Enum):
    BATCH = "batch"  # one transaction per micro-batch, on the driver
    PARTITION = "partition"  # one transaction per partition, on the executors


class WriteOutcome(enum.Enum):
    COMMITTED = "committed"
    SKIPPED = "skipped"  # already committed by an earlier attempt: a replay


class TwoPhaseCommitSink(ABC, Generic[TXN]):
    """Flink's ``TwoPhaseCommitSinkFunction``, one transaction per micro-batch (or partition).

    For each transaction context the template (``write``) does: skip it if ``is_committed``;
    ``recover_and_abort`` leftovers of a failed attempt; ``begin_transaction``; ``invoke`` with
    the rows; ``pre_commit``; ``commit``. Any failure before ``commit`` returns calls ``abort``
    and re-raises, so Spark fails (and on restart replays) the batch.

    Exactly once needs two things of a subclass: ``commit`` makes the whole transaction visible
    atomically *together with a durable record of its context*, and ``is_committed`` reads that
    record. Then a batch that committed but whose Spark commit log was never written (the driver
    died in between) is recognised on replay and skipped.
    """

    #: Where transactions run; a subclass sets it (class attribute or in ``__init__``).
    scope: TransactionScope = TransactionScope.BATCH

    def __init__(self, sink_id: str | None = None) -> None:
        # None: the streaming query's id, read when a batch arrives.
        self.sink_id = sink_id

    # -- what a subclass implements (Flink's names) ------------------------------------------

    @abstractmethod
    def begin_transaction(self, context: TransactionContext) -> TXN:
        """Start a transaction for ``context`` and return its handle."""

    @abstractmethod
    def invoke(self, transaction: TXN, rows: Iterable[Row]) -> None:
        """Write ``rows`` into ``transaction`` (not yet visible to readers)."""

    @abstractmethod
    def pre_commit(self, transaction: TXN) -> None:
        """Flush and prepare: after this, ``commit`` must not fail for lack of data or space."""

    @abstractmethod
    def commit(self, transaction: TXN) -> None:
        """Make the transaction visible, atomically with the record ``is_committed`` reads."""

    @abstractmethod
    def abort(self, transaction: TXN) -> None:
        """Discard the transaction; must tolerate a half-begun or already-failed one."""

    @abstractmethod
    def is_committed(self, context: TransactionContext) -> bool:
        """Whether a transaction for ``context`` was committed by an earlier attempt."""

    # -- optional hooks ----------------------------------------------------------------------

    def recover_and_abort(self, context: TransactionContext) -> None:
        """Discard what an earlier, uncommitted attempt at ``context`` may have left (Flink's
        ``recoverAndAbort``): e.g. a prepared file or an open broker transaction."""

    def sink_id_for(self, df: DataFrame) -> str:
        """The sink id of the batch ``df``: the given one, else the streaming query's id."""
        if self.sink_id is not None:
            return self.sink_id
        if is_connect(df):
            # foreachBatch runs in the Connect server's Python process, on a session Spark clones
            # for the query, and nothing tells it the query's id. No restart fixes that: the
            # supervisor must not retry.
            raise SuppressRestartsException(
                f"{type(self).__name__}: on Spark Connect give the sink a stable sink_id "
                "(e.g. the query's name): the streaming query's id is not visible to "
                "foreachBatch there"
            )
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise ValueError(
                f"{type(self).__name__}: no streaming query id on this thread; call it from "
                "writeStream.foreachBatch, or give the sink a stable sink_id"
            )
        return query_id

    def rows_of(self, df: DataFrame) -> Iterable[Row]:
        """The rows a batch-scope transaction is given: streamed one partition at a time, so the
        driver holds one partition, not the batch."""
        return df.toLocalIterator()

    def drain(self, df: DataFrame) -> None:
        """Run a skipped batch's plan without output. Spark commits a stateful query's state
        stores only when the batch's plan runs on every partition (and Spark 4.3 fails a batch
        whose ``foreachBatch`` did not), so a replay that writes nothing must still run it."""
        df.write.format("noop").mode("overwrite").save()

    # -- the template --------------------------------------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point."""
        sink_id = self.sink_id_for(df)
        if self.scope is TransactionScope.BATCH:

            def lazy_rows() -> Iterator[Row]:  # no Spark job unless the transaction reads them
                yield from self.rows_of(df)

            context = TransactionContext(sink_id, batch_id, None)
            if self.write(context, lazy_rows()) is WriteOutcome.SKIPPED:
                self.drain(df)
            return
        sink = self

        def write_partition(rows: Iterator[Row]) -> None:
            from pyspark import TaskContext

            task = TaskContext.get()
            assert task is not None, "write_partition runs in a Spark task"
            context = TransactionContext(sink_id, batch_id, task.partitionId())
            if sink.write(context, rows) is WriteOutcome.SKIPPED:
                for _ in rows:  # the partition's plan must still run to its end (see drain)
                    pass

        df.foreachPartition(write_partition)

    def write(self, context: TransactionContext, rows: Iterable[Row]) -> WriteOutcome:
        """Run one transaction for ``context``: skip, or begin/invoke/pre_commit/commit."""
        if self.is_committed(context):
            LOG.info("%s: already committed, replay skipped", context)
            return WriteOutcome.SKIPPED
        self.recover_and_abort(context)
        try:
            transaction = self.begin_transaction(context)
        except BatchAlreadyCommitted:
            LOG.info("%s: committed by another attempt meanwhile, skipped", context)
            return WriteOutcome.SKIPPED
        try:
            self.invoke(transaction, rows)
            self.pre_commit(transaction)
        except BatchAlreadyCommitted:
            self._abort_quietly(transaction, context)
            LOG.info("%s: committed by another attempt meanwhile, skipped", context)
            return WriteOutcome.SKIPPED
        except BaseException:
            self._abort_quietly(transaction, context)
            raise
        try:
            self.commit(transaction)
        except BaseException:
            # The outcome of a failed commit is unknown; abort what may be left, and a replay
            # asks is_committed.
            self._abort_quietly(transaction, context)
            raise
        return WriteOutcome.COMMITTED

    def _abort_quietly(self, transaction: TXN, context: TransactionContext) -> None:
        # The failure that led here is the one to report; an abort failing too is only logged.
        try:
            self.abort(transaction)
        except Exception:
            LOG.warning("%s: abort failed too", context, exc_info=True)
