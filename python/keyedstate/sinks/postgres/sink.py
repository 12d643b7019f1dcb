"""The sink: ``postgres()`` builds it, ``PostgresSink`` runs the two-phase-commit steps of one
batch in one PostgreSQL transaction on the driver (claim the batch's progress row, ``COPY`` the
rows, merge, record, commit), with the catalog, staging and progress modules doing the SQL."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from keyedstate.errors import BatchAlreadyCommitted
from keyedstate.sinks.postgres.catalog import (
    Column,
    check_schema,
    check_unique_key,
    resolve_table,
    table_columns,
)
from keyedstate.sinks.postgres.connection import DriverConnection
from keyedstate.sinks.postgres.errors import BatchErrors
from keyedstate.sinks.postgres.progress import (
    DEFAULT_PROGRESS_TABLE,
    claim_batch,
    create_progress_table,
    read_progress,
    record_batch,
    refuse_older_batch,
)
from keyedstate.sinks.postgres.staging import copy_rows, create_stage, merge_stage, stage
from keyedstate.sinks.postgres.types import copy_converters
from keyedstate.sinks.two_phase_commit import (
    TransactionContext,
    TransactionScope,
    TwoPhaseCommitSink,
)

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import StructType

LOG = logging.getLogger(__package__)  # the sink's one logger: keyedstate.sinks.postgres

Mode = Literal["append", "upsert"]


@dataclass
class PostgresTransaction:
    context: TransactionContext
    connection: psycopg.Connection[Any]
    rows: int = 0
    done: bool = field(default=False)


def postgres(
    table: str,
    *,
    mode: Mode = "append",
    key_columns: Sequence[str] = (),
    host: str = "127.0.0.1",
    port: int = 5432,
    dbname: str = "postgres",
    user: str = "postgres",
    password: str | None = None,
    conninfo: str = "",
    sink_id: str | None = None,
    progress_table: str = DEFAULT_PROGRESS_TABLE,
    connect_timeout_s: int = 10,
    validate: bool = True,
) -> PostgresSink:
    """An exactly-once PostgreSQL sink; use it as ``df.writeStream.foreachBatch(sink)``.

    ``table`` is resolved like SQL does (``name`` on the search path, or ``schema.name``; quote
    mixed case). ``mode="upsert"`` needs ``key_columns`` covered by a unique index or primary key;
    a key seen twice in one batch keeps its last row. ``sink_id`` defaults to the streaming
    query's id (kept in the checkpoint) and the table; give one to keep the progress across a new
    checkpoint on purpose. ``conninfo`` (a libpq string or URI) overrides the keywords it sets.
    With ``validate`` (default) the server, the credentials, the table and the key columns are
    checked now; call ``sink.check(df)`` to check a DataFrame's columns before starting it.
    """
    sink = PostgresSink(
        table,
        mode=mode,
        key_columns=key_columns,
        connection=dict(
            host=host, port=port, dbname=dbname, user=user, password=password, conninfo=conninfo
        ),
        sink_id=sink_id,
        progress_table=progress_table,
        connect_timeout_s=connect_timeout_s,
    )
    if validate:
        sink.validate()
    return sink


class PostgresSink(TwoPhaseCommitSink[PostgresTransaction]):
    """One PostgreSQL transaction per micro-batch, on the driver. Build it with ``postgres()``."""

    scope = TransactionScope.BATCH

    def __init__(
        self,
        table: str,
        *,
        mode: Mode,
        key_columns: Sequence[str],
        connection: dict[str, Any],
        sink_id: str | None,
        progress_table: str,
        connect_timeout_s: int,
    ) -> None:
        super().__init__(sink_id)
        if mode not in ("append", "upsert"):
            raise ValueError(f"postgres sink: mode must be 'append' or 'upsert', not {mode!r}")
        if mode == "upsert" and not key_columns:
            raise ValueError("postgres sink: mode='upsert' needs key_columns (the conflict key)")
        if mode == "append" and key_columns:
            raise ValueError("postgres sink: key_columns are for mode='upsert' only")
        if isinstance(key_columns, str):
            raise ValueError("postgres sink: key_columns must be a list of names, not a string")
        if connect_timeout_s < 2:  # libpq treats 1 as 2 and 0 as forever
            raise ValueError(
                f"postgres sink: connect_timeout_s must be >= 2, not {connect_timeout_s}"
            )
        self.table = table
        self.mode = mode
        self.key_columns = list(key_columns)
        self.progress_table = progress_table
        self.connect_timeout_s = connect_timeout_s
        self._driver = DriverConnection(connection, connect_timeout_s)
        self.server = self._driver.server
        self._qualified: tuple[str, str] | None = None  # (schema, table) once resolved
        self._columns: dict[str, Column] | None = None
        self._checked_schema: str | None = None
        self._batch_columns: list[str] = []
        self._converters: list[tuple[int, Callable[[Any], Any]]] = []

    # -- set-up and validation ---------------------------------------------------------------

    def validate(self) -> None:
        """Check server, credentials, table, key columns; create the progress table."""
        connection = self._driver.connect()
        self._describe_table(connection)
        create_progress_table(
            connection,
            self.progress_table,
            server=self.server,
            user=self._driver.params.get("user"),
        )

    def check(self, df: DataFrame) -> None:
        """Raise ``PostgresSinkError`` if ``df``'s columns cannot be written to the table."""
        self._check_schema(df.schema, self._driver.connect())

    @property
    def table_name(self) -> str:
        if self._qualified is None:
            return self.table
        return f"{self._qualified[0]}.{self._qualified[1]}"

    def _describe_table(self, connection: psycopg.Connection[Any]) -> dict[str, Column]:
        if self._columns is not None:
            return self._columns
        oid, self._qualified = resolve_table(
            connection, self.table, dbname=self._driver.params.get("dbname"), server=self.server
        )
        columns = table_columns(connection, oid)
        if self.mode == "upsert":
            check_unique_key(connection, oid, columns, self.key_columns, self.table_name)
        connection.rollback()
        self._columns = columns
        return columns

    def _check_schema(self, schema: StructType, connection: psycopg.Connection[Any]) -> None:
        if self._checked_schema == schema.json():
            return
        columns = self._describe_table(connection)
        check_schema(
            schema,
            columns,
            table_name=self.table_name,
            server=self.server,
            upsert_keys=self.key_columns if self.mode == "upsert" else None,
        )
        self._checked_schema = schema.json()

    # -- the two-phase-commit steps --------------------------------------------------------------

    def sink_id_for(self, df: DataFrame) -> str:
        if self.sink_id is not None:
            return self.sink_id
        # One query may write several tables: each is its own sink.
        return f"{super().sink_id_for(df)}/{self.table}"

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self._check_schema(df.schema, self._driver.connect())
        self._batch_columns = df.schema.fieldNames()
        self._converters = copy_converters(df.schema)
        super().__call__(df, batch_id)

    def is_committed(self, context: TransactionContext) -> bool:
        connection = self._driver.connect()
        with self._errors(context, "reading the progress table"):
            newest, found = read_progress(connection, self.progress_table, context)
        refuse_older_batch(context, newest, self.progress_table, self.server)
        return found

    def begin_transaction(self, context: TransactionContext) -> PostgresTransaction:
        connection = self._driver.connect()
        transaction = PostgresTransaction(context, connection)
        with self._errors(context, "beginning the transaction"):
            # Spark records the batch as done once this commit returns: the commit must be
            # durable when it does, whatever the server's default (synchronous_commit=off
            # acknowledges commits a crash can still lose).
            connection.execute("SET LOCAL synchronous_commit TO on")
            if not claim_batch(connection, self.progress_table, context, self.table_name):
                connection.rollback()
                raise BatchAlreadyCommitted(str(context))
            if self.mode == "upsert":
                create_stage(connection, self._table_sql(), self._batch_columns)
        return transaction

    def invoke(self, transaction: PostgresTransaction, rows: Iterable[Row]) -> None:
        target = stage() if self.mode == "upsert" else self._table_sql()
        transaction.rows = copy_rows(
            transaction.connection,
            target,
            self._batch_columns,
            rows,
            self._converters,
            self._errors(transaction.context, "copying the rows"),
        )

    def pre_commit(self, transaction: PostgresTransaction) -> None:
        context, connection = transaction.context, transaction.connection
        with self._errors(context, "merging the batch"):
            if self.mode == "upsert":
                merge_stage(connection, self._table_sql(), self._batch_columns, self.key_columns)
            record_batch(connection, self.progress_table, context, transaction.rows)

    def commit(self, transaction: PostgresTransaction) -> None:
        with self._errors(transaction.context, "committing"):
            transaction.connection.commit()
        transaction.done = True
        LOG.info("%s: %d rows committed to %s", transaction.context, transaction.rows, self.table)

    def abort(self, transaction: PostgresTransaction) -> None:
        if transaction.done:
            return
        transaction.done = True
        try:
            transaction.connection.rollback()
        except Exception:
            # A lost connection: the server rolls back by itself; reconnect next batch.
            self._driver.close()

    # -- helpers ---------------------------------------------------------------------------------

    def _table_sql(self) -> psycopg.sql.Composable:
        from psycopg import sql

        assert self._qualified is not None, "the table is resolved before a batch is written"
        return sql.Identifier(*self._qualified)

    def _errors(self, context: TransactionContext, doing: str) -> BatchErrors:
        return BatchErrors(self._driver, self.table_name, context, doing)
