"""Where a batch's rows go, in its transaction: streamed with ``COPY`` straight into the table
(append), or into a temporary staging table merged into it with ``INSERT ... ON CONFLICT DO
UPDATE``, the last row of a key in the batch winning (upsert)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from keyedstate.sinks.postgres.errors import first_line

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import Row

_STAGE = "keyedstate_stage"
_SEQ = "keyedstate_seq"


def _identifiers(names: Sequence[str]) -> psycopg.sql.Composable:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def stage() -> psycopg.sql.Composable:
    """The staging table's name."""
    from psycopg import sql

    return sql.Identifier(_STAGE)


def create_stage(
    connection: psycopg.Connection[Any], table: psycopg.sql.Composable, columns: Sequence[str]
) -> None:
    """The staging table: the table's ``columns`` and a sequence number (the rows' order),
    dropped at commit."""
    from psycopg import sql

    connection.execute(
        sql.SQL(
            "CREATE TEMPORARY TABLE {stage} ON COMMIT DROP AS SELECT {cols} FROM "
            "{table} WITH NO DATA"
        ).format(stage=sql.Identifier(_STAGE), cols=_identifiers(columns), table=table)
    )
    connection.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint GENERATED ALWAYS AS IDENTITY").format(
            sql.Identifier(_STAGE), sql.Identifier(_SEQ)
        )
    )


class _RowsFailed(Exception):  # noqa: N818 - a signal inside copy_rows, never raised out of it
    """Ends a COPY whose rows failed (a Spark task of the batch, a conversion) with a short
    reason. psycopg sends the text of the exception that leaves the COPY block to the server as
    COPY's failure message, and the server takes at most 10,000 bytes there: a Spark job
    failure's text, with its executor stack traces, made the server drop the connection ("protocol
    synchronization was lost") and psycopg log "error ignored terminating ...: too many values to
    unpack"."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"the batch's rows failed: {type(error).__name__}: {first_line(error)}")
        self.error = error


def copy_rows(
    connection: psycopg.Connection[Any],
    target: psycopg.sql.Composable,
    columns: Sequence[str],
    rows: Iterable[Row],
    converters: Sequence[tuple[int, Callable[[Any], Any]]],
    errors: AbstractContextManager[None],
) -> int:
    """``COPY`` the rows into ``target`` (the table or the staging table), each converted by
    ``converters`` (column index, conversion); the number of rows. psycopg's errors go through
    ``errors``; the rows' own failure is raised as it was, its causes kept."""
    import psycopg
    from psycopg import sql

    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(target, _identifiers(columns))
    count = 0
    failed: Exception | None = None
    try:
        with errors:
            with connection.cursor().copy(statement) as copy:
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
    return count


def merge_stage(
    connection: psycopg.Connection[Any],
    table: psycopg.sql.Composable,
    columns: Sequence[str],
    key_columns: Sequence[str],
) -> None:
    """Upsert the staging table's rows into ``table``: the last row of each key wins (the COPY's
    order is the batch's), the other columns of a key already there updated."""
    from psycopg import sql

    keys = _identifiers(key_columns)
    others = [c for c in columns if c not in key_columns]
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
            table=table,
            cols=_identifiers(columns),
            keys=keys,
            stage=sql.Identifier(_STAGE),
            seq=sql.Identifier(_SEQ),
            action=action,
        )
    )
