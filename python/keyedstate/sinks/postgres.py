"""An exactly-once PostgreSQL sink for ``foreachBatch`` (Flink's ``GenericWriteAheadSink`` idea,
with the database as the log).

Each micro-batch is written in ONE database transaction that also inserts ``(sink id, batch id)``
into a progress table; a replayed batch whose row is there is skipped, one whose row is not is
written. The driver streams the batch (``toLocalIterator``, one partition at a time) into the
transaction with ``COPY``: straight into the table (append), or into a temporary staging table
merged with ``INSERT ... ON CONFLICT DO UPDATE`` (upsert). docs/exactly-once.md explains the
choice. ``psycopg`` (v3) is imported only once a sink is built (``keyedstate[postgres]``).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from keyedstate.errors import BatchAlreadyCommitted, KeyedStateError
from keyedstate.sinks.two_phase_commit import (
    TransactionContext,
    TransactionScope,
    TwoPhaseCommitSink,
)

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import DataType, StructType

__all__ = ["PostgresSink", "PostgresSinkError", "postgres"]

LOG = logging.getLogger(__name__)

Mode = Literal["append", "upsert"]
DEFAULT_PROGRESS_TABLE = "keyedstate_sink_progress"
# Progress rows kept per sink: only the newest batch can be replayed; a few more help debugging.
PROGRESS_ROWS_KEPT = 100
_STAGE = "keyedstate_stage"
_SEQ = "keyedstate_seq"


class PostgresSinkError(KeyedStateError, RuntimeError):
    """A PostgreSQL sink could not be set up or could not write a batch; the message names the
    server, the object and the fix. Raised in Python, so ``error_id`` is ``None``."""


@dataclass
class Column:
    name: str
    type: str  # format_type(), e.g. "bigint", "character varying(20)"
    category: str  # pg_type.typcategory: S string, N numeric, D date/time, ...
    not_null: bool
    has_default: bool
    generated: bool

    def __str__(self) -> str:
        return f"{self.name} {self.type}"


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
        self._params = _connection_params(connection, connect_timeout_s)
        self.server = f"{self._params.get('host', '?')}:{self._params.get('port', 5432)}"
        self._connection: psycopg.Connection[Any] | None = None
        self._qualified: tuple[str, str] | None = None  # (schema, table) once resolved
        self._columns: dict[str, Column] | None = None
        self._checked_schema: str | None = None
        self._batch_columns: list[str] = []
        self._converters: list[tuple[int, Callable[[Any], Any]]] = []

    # -- set-up and validation ---------------------------------------------------------------

    def validate(self) -> None:
        """Check server, credentials, table, key columns; create the progress table."""
        connection = self._connect()
        self._describe_table(connection)
        self._ensure_progress_table(connection)

    def check(self, df: DataFrame) -> None:
        """Raise ``PostgresSinkError`` if ``df``'s columns cannot be written to the table."""
        self._check_schema(df.schema, self._connect())

    @property
    def table_name(self) -> str:
        if self._qualified is None:
            return self.table
        return f"{self._qualified[0]}.{self._qualified[1]}"

    def _connect(self) -> psycopg.Connection[Any]:
        """The driver's connection, reconnecting if the server went away since the last batch."""
        import psycopg

        if self._connection is not None:
            try:
                if not self._connection.closed:
                    self._connection.execute("SELECT 1")
                    self._connection.rollback()
                    return self._connection
            except psycopg.Error:
                pass
            self._close()
        try:
            self._connection = psycopg.connect(**self._params)
        except psycopg.OperationalError as error:
            raise PostgresSinkError(self._connect_failure(error)) from error
        return self._connection

    def _close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except Exception:  # a broken connection may fail to close; it is dropped anyway
                LOG.debug("closing a broken connection failed", exc_info=True)
            self._connection = None

    def _connect_failure(self, error: Exception) -> str:
        reason = _first_line(error)
        user, dbname = self._params.get("user"), self._params.get("dbname")
        lowered = reason.lower()
        if (
            "password" in lowered
            or "authentication" in lowered
            or ("role" in lowered and "does not exist" in lowered)
            or "pg_hba.conf" in lowered
        ):
            return (
                f"PostgreSQL {self.server} refused user {user!r} on database {dbname!r}: "
                f"{reason}. Check the user name and password (and pg_hba.conf)"
            )
        if "database" in lowered and "does not exist" in lowered:
            return (
                f"PostgreSQL {self.server} has no database {dbname!r} ({reason}). "
                f"Create it (CREATE DATABASE ...) or pass the right dbname"
            )
        return (
            f"PostgreSQL server {self.server} is unreachable within "
            f"{self.connect_timeout_s}s: {reason}. Check that it is running and listening on "
            "that host and port"
        )

    def _describe_table(self, connection: psycopg.Connection[Any]) -> dict[str, Column]:
        if self._columns is not None:
            return self._columns
        oid_row = connection.execute("SELECT to_regclass(%s)::oid", [self.table]).fetchone()
        if oid_row is None or oid_row[0] is None:
            connection.rollback()
            raise PostgresSinkError(
                f"postgres sink: table {self.table!r} does not exist in database "
                f"{self._params.get('dbname')!r} on {self.server}. Create it first (CREATE TABLE "
                f"{self.table} (...) with the DataFrame's columns)"
            )
        oid = oid_row[0]
        schema, name = connection.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = %s",
            [oid],
        ).fetchone() or ("?", "?")
        self._qualified = (schema, name)
        rows = connection.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory, "
            "a.attnotnull, a.atthasdef OR a.attidentity <> '', a.attgenerated <> '' "
            "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            [oid],
        ).fetchall()
        columns = {r[0]: Column(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows}
        if self.mode == "upsert":
            self._check_key_columns(connection, oid, columns)
        connection.rollback()
        self._columns = columns
        return columns

    def _check_key_columns(
        self, connection: psycopg.Connection[Any], oid: int, columns: dict[str, Column]
    ) -> None:
        unknown = [k for k in self.key_columns if k not in columns]
        if unknown:
            raise PostgresSinkError(
                f"postgres sink: key column(s) {', '.join(unknown)} not in table "
                f"{self.table_name} (columns: {', '.join(columns)}). Pass key_columns that name "
                "the table's unique key"
            )
        # ON CONFLICT (keys) needs a non-partial unique index on exactly these columns.
        indexes = connection.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL "
            "AND i.indexprs IS NULL GROUP BY i.indexrelid",
            [oid],
        ).fetchall()
        if not any(sorted(r[0]) == sorted(self.key_columns) for r in indexes):
            keys = ", ".join(self.key_columns)
            raise PostgresSinkError(
                f"postgres sink: table {self.table_name} has no unique index or primary key on "
                f"exactly ({keys}), which upsert needs. Fix: ALTER TABLE {self.table_name} ADD "
                f"PRIMARY KEY ({keys}) (or CREATE UNIQUE INDEX ON {self.table_name} ({keys}))"
            )

    def _ensure_progress_table(self, connection: psycopg.Connection[Any]) -> None:
        from psycopg import errors, sql

        try:
            connection.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, batch_id bigint NOT "
                    "NULL, target_table text NOT NULL, row_count bigint, committed_at "
                    "timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink_id, batch_id))"
                ).format(_identifier(self.progress_table))
            )
            connection.commit()
        except errors.UniqueViolation:  # another sink created it at the same moment
            connection.rollback()
        except Exception as error:
            connection.rollback()
            raise PostgresSinkError(
                f"postgres sink: cannot create the progress table {self.progress_table} on "
                f"{self.server}: {_first_line(error)}. Create it, or grant CREATE to user "
                f"{self._params.get('user')!r}"
            ) from error

    def _check_schema(self, schema: StructType, connection: psycopg.Connection[Any]) -> None:
        if self._checked_schema == schema.json():
            return
        columns = self._describe_table(connection)
        problems: list[str] = []
        fixes: list[str] = []
        names = schema.fieldNames()
        missing = [f for f in schema.fields if f.name not in columns]
        if missing:
            problems.append("not in the table: " + ", ".join(f.name for f in missing))
            fixes.append(
                f"ALTER TABLE {self.table_name} "
                + ", ".join(f"ADD COLUMN {f.name} {_pg_type(f.dataType)}" for f in missing)
                + ", or select/rename the DataFrame's columns"
            )
        required = [c for c in columns.values() if c.not_null and not c.has_default]
        unfilled = [c.name for c in required if c.name not in names]
        if unfilled:
            problems.append(
                "NOT NULL without default, missing in the DataFrame: " + ", ".join(unfilled)
            )
            fixes.append("add these columns to the DataFrame or give them a default")
        generated = [n for n in names if n in columns and columns[n].generated]
        if generated:
            problems.append("generated in the table: " + ", ".join(generated))
            fixes.append("drop these columns from the DataFrame")
        for f in schema.fields:
            column = columns.get(f.name)
            if column is not None and not _compatible(f.dataType, column.category):
                problems.append(
                    f"{f.name} is {f.dataType.simpleString()} in the DataFrame but {column.type} "
                    "in the table"
                )
                fixes.append(f"cast {f.name} in the DataFrame or change the column's type")
        if self.mode == "upsert":
            absent = [k for k in self.key_columns if k not in names]
            if absent:
                problems.append("key column(s) missing in the DataFrame: " + ", ".join(absent))
                fixes.append("select the key columns")
        if problems:
            expected = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
            actual = ", ".join(str(c) for c in columns.values())
            raise PostgresSinkError(
                f"postgres sink: table {self.table_name} on {self.server} does not match the "
                f"DataFrame ({'; '.join(problems)}). DataFrame: ({expected}); table: ({actual}). "
                f"Fix: {'; '.join(fixes)}"
            )
        self._checked_schema = schema.json()

    # -- the two-phase-commit steps --------------------------------------------------------------

    def sink_id_for(self, df: DataFrame) -> str:
        if self.sink_id is not None:
            return self.sink_id
        # One query may write several tables: each is its own sink.
        return f"{super().sink_id_for(df)}/{self.table}"

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self._check_schema(df.schema, self._connect())
        self._batch_columns = df.schema.fieldNames()
        self._converters = _converters(df.schema)
        super().__call__(df, batch_id)

    def is_committed(self, context: TransactionContext) -> bool:
        from psycopg import sql

        connection = self._connect()
        with self._errors(context, "reading the progress table"):
            newest, found = connection.execute(
                sql.SQL(
                    "SELECT max(batch_id), bool_or(batch_id = %s) FROM {} WHERE sink_id = %s"
                ).format(_identifier(self.progress_table)),
                [context.batch_id, context.sink_id],
            ).fetchone() or (None, None)
            connection.rollback()
        # Spark replays at most the newest batch (batch n runs only once n - 1 is in its commit
        # log), so an older one means another checkpoint under this sink id: never skip it.
        if newest is not None and context.batch_id < newest:
            raise PostgresSinkError(
                f"postgres sink {context.sink_id}: the query replays batch {context.batch_id} "
                f"but {self.progress_table} on {self.server} has batch {newest} committed: the "
                "checkpoint was reset, restored from an older copy or belongs to another query. "
                "Fix: give the sink a new sink_id (new output), or delete the sink's rows from "
                f"{self.progress_table} to write again"
            )
        return bool(found)

    def begin_transaction(self, context: TransactionContext) -> PostgresTransaction:
        from psycopg import sql

        connection = self._connect()
        transaction = PostgresTransaction(context, connection)
        with self._errors(context, "beginning the transaction"):
            # Spark records the batch as done once this commit returns: the commit must be
            # durable when it does, whatever the server's default (synchronous_commit=off
            # acknowledges commits a crash can still lose).
            connection.execute("SET LOCAL synchronous_commit TO on")
            # Claiming the batch first holds its progress row's lock: a concurrent attempt at
            # the same batch waits, then finds it committed.
            claimed = connection.execute(
                sql.SQL(
                    "INSERT INTO {} (sink_id, batch_id, target_table) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING"
                ).format(_identifier(self.progress_table)),
                [context.sink_id, context.batch_id, self.table_name],
            ).rowcount
            if claimed == 0:
                connection.rollback()
                raise BatchAlreadyCommitted(str(context))
            if self.mode == "upsert":
                connection.execute(
                    sql.SQL(
                        "CREATE TEMPORARY TABLE {stage} ON COMMIT DROP AS SELECT {cols} FROM "
                        "{table} WITH NO DATA"
                    ).format(
                        stage=sql.Identifier(_STAGE),
                        cols=_identifiers(self._batch_columns),
                        table=self._table_sql(),
                    )
                )
                connection.execute(
                    sql.SQL(
                        "ALTER TABLE {} ADD COLUMN {} bigint GENERATED ALWAYS AS IDENTITY"
                    ).format(sql.Identifier(_STAGE), sql.Identifier(_SEQ))
                )
        return transaction

    def invoke(self, transaction: PostgresTransaction, rows: Iterable[Row]) -> None:
        import psycopg
        from psycopg import sql

        target = sql.Identifier(_STAGE) if self.mode == "upsert" else self._table_sql()
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            target, _identifiers(self._batch_columns)
        )
        converters = self._converters
        count = 0
        failed: Exception | None = None
        try:
            with self._errors(transaction.context, "copying the rows"):
                with transaction.connection.cursor().copy(statement) as copy:
                    try:
                        if converters:
                            for row in rows:
                                values = list(row)
                                for index, convert in converters:
                                    values[index] = convert(values[index])
                                copy.write_row(values)
                                count += 1
                        else:
                            for row in rows:
                                copy.write_row(row)
                                count += 1
                    except psycopg.Error:
                        raise
                    except Exception as error:
                        raise _RowsFailed(error) from None
        except _RowsFailed as stopped:
            failed = stopped.error
        if failed is not None:
            # Raised here, outside the handler: the batch fails with the rows' own error, its
            # causes as they were.
            raise failed
        transaction.rows = count

    def pre_commit(self, transaction: PostgresTransaction) -> None:
        from psycopg import sql

        context, connection = transaction.context, transaction.connection
        with self._errors(context, "merging the batch"):
            if self.mode == "upsert":
                keys = _identifiers(self.key_columns)
                others = [c for c in self._batch_columns if c not in self.key_columns]
                action = (
                    sql.SQL("DO UPDATE SET {}").format(
                        sql.SQL(", ").join(
                            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others
                        )
                    )
                    if others
                    else sql.SQL("DO NOTHING")
                )
                # The last row of a key within the batch wins (COPY order = the batch's order).
                connection.execute(
                    sql.SQL(
                        "INSERT INTO {table} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM "
                        "{stage} ORDER BY {keys}, {seq} DESC ON CONFLICT ({keys}) {action}"
                    ).format(
                        table=self._table_sql(),
                        cols=_identifiers(self._batch_columns),
                        keys=keys,
                        stage=sql.Identifier(_STAGE),
                        seq=sql.Identifier(_SEQ),
                        action=action,
                    )
                )
            progress = _identifier(self.progress_table)
            connection.execute(
                sql.SQL("UPDATE {} SET row_count = %s WHERE sink_id = %s AND batch_id = %s").format(
                    progress
                ),
                [transaction.rows, context.sink_id, context.batch_id],
            )
            connection.execute(
                sql.SQL("DELETE FROM {} WHERE sink_id = %s AND batch_id < %s").format(progress),
                [context.sink_id, context.batch_id - PROGRESS_ROWS_KEPT],
            )

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
            self._close()

    # -- helpers ---------------------------------------------------------------------------------

    def _table_sql(self) -> psycopg.sql.Composable:
        from psycopg import sql

        assert self._qualified is not None, "the table is resolved before a batch is written"
        return sql.Identifier(*self._qualified)

    def _errors(self, context: TransactionContext, doing: str) -> _ErrorTranslator:
        return _ErrorTranslator(self, context, doing)

    def __getstate__(self) -> dict[str, Any]:
        # A connection does not travel; a copy of the sink reconnects.
        state = dict(self.__dict__)
        state["_connection"] = None
        return state


class _RowsFailed(Exception):  # noqa: N818 - a signal inside invoke, never raised out of it
    """Ends a COPY whose rows failed (a Spark task of the batch, a conversion) with a short
    reason. psycopg sends the text of the exception that leaves the COPY block to the server as
    COPY's failure message, and the server takes at most 10,000 bytes there: a Spark job
    failure's text, with its executor stack traces, made the server drop the connection ("protocol
    synchronization was lost") and psycopg log "error ignored terminating ...: too many values to
    unpack"."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"the batch's rows failed: {type(error).__name__}: {_first_line(error)}")
        self.error = error


class _ErrorTranslator:
    """Turns a psycopg error during a batch into a PostgresSinkError naming server, table,
    batch and what to do; a lost connection is dropped so the next batch reconnects."""

    def __init__(self, sink: PostgresSink, context: TransactionContext, doing: str) -> None:
        self.sink, self.context, self.doing = sink, context, doing

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: object
    ) -> bool:
        import psycopg

        if error is None or not isinstance(error, psycopg.Error):
            return False
        sink, where = self.sink, f"batch {self.context.batch_id} of sink {self.context.sink_id}"
        reason = _first_line(error)
        if isinstance(error, psycopg.OperationalError) and (
            sink._connection is None or sink._connection.broken
        ):
            sink._close()
            raise PostgresSinkError(
                f"postgres sink: lost the connection to PostgreSQL {sink.server} while "
                f"{self.doing} ({where}, table {sink.table_name}): {reason}. The server rolled "
                "the batch back; restart the query once the server is back: the batch is "
                "replayed and written once"
            ) from error
        state = getattr(error, "sqlstate", None) or "?"
        raise PostgresSinkError(
            f"postgres sink: PostgreSQL {sink.server} refused {self.doing} ({where}, table "
            f"{sink.table_name}): [{state}] {reason}. Nothing of this batch was written"
        ) from error


def _connection_params(connection: dict[str, Any], connect_timeout_s: int) -> dict[str, Any]:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    keywords = {k: v for k, v in connection.items() if k != "conninfo" and v is not None}
    # conninfo's own settings win over the keywords' defaults.
    given = conninfo_to_dict(make_conninfo(connection.get("conninfo") or ""))
    params: dict[str, Any] = {**keywords, **given}
    params.setdefault("connect_timeout", connect_timeout_s)
    params["application_name"] = "keyedstate-sink"
    return params


# libpq's wording around the reason, which the sink's message already says better.
_LIBPQ_NOISE = re.compile(
    r'connection failed: |connection to server at "[^"]*"(, port \d+)? failed: |FATAL:\s+'
    r"|\s*Is the server running on that host and accepting TCP/IP connections\?"
)


def _first_line(error: BaseException) -> str:
    text = _LIBPQ_NOISE.sub("", str(error)).strip() or type(error).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:300]


def _identifier(name: str) -> psycopg.sql.Composable:
    """A possibly schema-qualified name, each part quoted."""
    from psycopg import sql

    return sql.Identifier(*name.split(".", 1))


def _identifiers(names: Sequence[str]) -> psycopg.sql.Composable:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _pg_type(data_type: DataType) -> str:
    """A PostgreSQL type for a Spark type, for the fix a schema error suggests."""
    name = type(data_type).__name__
    return {
        "StringType": "text",
        "VarcharType": "text",
        "CharType": "text",
        "LongType": "bigint",
        "IntegerType": "integer",
        "ShortType": "smallint",
        "ByteType": "smallint",
        "DoubleType": "double precision",
        "FloatType": "real",
        "BooleanType": "boolean",
        "DateType": "date",
        "TimestampType": "timestamptz",
        "TimestampNTZType": "timestamp",
        "BinaryType": "bytea",
        "DecimalType": "numeric",
        "MapType": "jsonb",
        "StructType": "jsonb",
    }.get(name, "jsonb" if name == "ArrayType" else "text")


# Spark type -> the PostgreSQL type categories (pg_type.typcategory) it can be written to.
_CATEGORIES = {
    "StringType": "SUE",  # text types, json/uuid/..., enums
    "VarcharType": "SUE",
    "CharType": "SUE",
    "LongType": "N",
    "IntegerType": "N",
    "ShortType": "N",
    "ByteType": "N",
    "DoubleType": "N",
    "FloatType": "N",
    "DecimalType": "N",
    "BooleanType": "B",
    "DateType": "D",
    "TimestampType": "D",
    "TimestampNTZType": "D",
    "BinaryType": "U",
    "ArrayType": "A",
    "MapType": "U",
    "StructType": "U",
    "DayTimeIntervalType": "T",
}


def _compatible(data_type: DataType, category: str) -> bool:
    allowed = _CATEGORIES.get(type(data_type).__name__)
    return allowed is None or category in allowed


def _converters(schema: StructType) -> list[tuple[int, Callable[[Any], Any]]]:
    """Per-column conversions from collected Spark values to what COPY writes correctly."""
    from psycopg.types.json import Jsonb

    result: list[tuple[int, Callable[[Any], Any]]] = []
    for index, f in enumerate(schema.fields):
        name = type(f.dataType).__name__
        if name == "TimestampType":
            # Collected as naive local time; make it an instant for timestamptz.
            result.append((index, lambda v: None if v is None else v.astimezone(dt.timezone.utc)))
        elif name in ("MapType", "StructType"):
            result.append((index, lambda v: None if v is None else Jsonb(_plain(v))))
        elif name == "BinaryType":
            result.append((index, lambda v: None if v is None else bytes(v)))
    return result


def _plain(value: Any) -> Any:  # noqa: ANN401 - any collected Spark value
    from pyspark.sql import Row

    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if hasattr(value, "is_finite"):  # Decimal
        return str(value)
    return value
