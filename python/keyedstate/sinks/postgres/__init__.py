"""An exactly-once PostgreSQL sink for ``foreachBatch`` (Flink's ``GenericWriteAheadSink`` idea,
with the database as the log).

Each micro-batch is written in ONE database transaction that also inserts ``(sink id, batch id)``
into a progress table; a replayed batch whose row is there is skipped, one whose row is not is
written. The driver streams the batch (``toLocalIterator``, one partition at a time) into the
transaction with ``COPY``: straight into the table (append), or into a temporary staging table
merged with ``INSERT ... ON CONFLICT DO UPDATE`` (upsert). docs/exactly-once.md explains the
choice. ``psycopg`` (v3) is imported only once a sink is built (``keyedstate[postgres]``).

One job per module, lowest first:

* ``errors``: ``PostgresSinkError``, and psycopg's errors during a batch turned into it;
* ``connection``: the driver's connection (parameters, reconnecting, a failed connect's message);
* ``types``: Spark's types and PostgreSQL's (type categories, COPY's conversions);
* ``catalog``: the table as the server's catalog describes it, and whether a DataFrame fits it;
* ``progress``: the progress table (created, read, a batch claimed and recorded);
* ``staging``: the rows' ``COPY``, the upsert's staging table and merge;
* ``sink``: ``postgres()`` and ``PostgresSink``, the two-phase-commit steps using the others.
"""

from keyedstate.sinks.postgres.errors import PostgresSinkError
from keyedstate.sinks.postgres.sink import PostgresSink, postgres

__all__ = ["PostgresSink", "PostgresSinkError", "postgres"]
