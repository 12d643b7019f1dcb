"""Exactly-once sinks for ``foreachBatch``: a generic two-phase-commit base class (Flink's
``TwoPhaseCommitSinkFunction``), PostgreSQL and Kafka. See docs/exactly-once.md."""

from __future__ import annotations

# Eager: the kafka module and the postgres package import their clients (psycopg, py4j) only
# when used, and a lazy __getattr__ would lose to the submodule once anything imported
# keyedstate.sinks.kafka. The factories shadow their (sub)modules as attributes (kafka is the
# KafkaSink class, postgres a function), so import from the modules with
# ``from keyedstate.sinks.postgres.sink import ...``, never ``import keyedstate.sinks.postgres.x``.
from keyedstate.errors import BatchAlreadyCommitted
from keyedstate.sinks.kafka import KafkaSink, KafkaSinkError, kafka
from keyedstate.sinks.postgres import PostgresSink, PostgresSinkError, postgres
from keyedstate.sinks.two_phase_commit import (
    TransactionContext,
    TransactionScope,
    TwoPhaseCommitSink,
    WriteOutcome,
)

__all__ = [
    "BatchAlreadyCommitted",
    "KafkaSink",
    "KafkaSinkError",
    "PostgresSink",
    "PostgresSinkError",
    "TransactionContext",
    "TransactionScope",
    "TwoPhaseCommitSink",
    "WriteOutcome",
    "kafka",
    "postgres",
]
