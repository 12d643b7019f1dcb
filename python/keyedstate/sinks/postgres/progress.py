"""The progress table, the sink's log in the database: one row per (sink id, batch id),
inserted in the batch's own transaction, so a batch's rows and its "done" commit together. How
the table is created, a replay told apart, a batch claimed and recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keyedstate.sinks.postgres.errors import PostgresSinkError, first_line

if TYPE_CHECKING:
    import psycopg

    from keyedstate.sinks.two_phase_commit import TransactionContext

DEFAULT_PROGRESS_TABLE = "keyedstate_sink_progress"
# Progress rows kept per sink: only the newest batch can be replayed; a few more help debugging.
PROGRESS_ROWS_KEPT = 100


def _identifier(name: str) -> psycopg.sql.Composable:
    """A possibly schema-qualified name, each part quoted."""
    from psycopg import sql

    return sql.Identifier(*name.split(".", 1))


def create_progress_table(
    connection: psycopg.Connection[Any], progress_table: str, *, server: str, user: str | None
) -> None:
    """The progress table, created unless it exists."""
    from psycopg import errors, sql

    try:
        connection.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, batch_id bigint NOT "
                "NULL, target_table text NOT NULL, row_count bigint, committed_at "
                "timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink_id, batch_id))"
            ).format(_identifier(progress_table))
        )
        connection.commit()
    except errors.UniqueViolation:  # another sink created it at the same moment
        connection.rollback()
    except Exception as error:
        connection.rollback()
        raise PostgresSinkError(
            f"postgres sink: cannot create the progress table {progress_table} on "
            f"{server}: {first_line(error)}. Create it, or grant CREATE to user {user!r}"
        ) from error


def read_progress(
    connection: psycopg.Connection[Any], progress_table: str, context: TransactionContext
) -> tuple[int | None, bool]:
    """The sink's newest committed batch (``None`` before its first) and whether the context's
    batch is committed; the read's transaction is ended."""
    from psycopg import sql

    newest, found = connection.execute(
        sql.SQL("SELECT max(batch_id), bool_or(batch_id = %s) FROM {} WHERE sink_id = %s").format(
            _identifier(progress_table)
        ),
        [context.batch_id, context.sink_id],
    ).fetchone() or (None, None)
    connection.rollback()
    return newest, bool(found)


def refuse_older_batch(
    context: TransactionContext, newest: int | None, progress_table: str, server: str
) -> None:
    """Raise ``PostgresSinkError`` if the query replays a batch older than the newest one the
    sink committed."""
    # Spark replays at most the newest batch (batch n runs only once n - 1 is in its commit
    # log), so an older one means another checkpoint under this sink id: never skip it.
    if newest is not None and context.batch_id < newest:
        raise PostgresSinkError(
            f"postgres sink {context.sink_id}: the query replays batch {context.batch_id} "
            f"but {progress_table} on {server} has batch {newest} committed: the "
            "checkpoint was reset, restored from an older copy or belongs to another query. "
            "Fix: give the sink a new sink_id (new output), or delete the sink's rows from "
            f"{progress_table} to write again"
        )


def claim_batch(
    connection: psycopg.Connection[Any],
    progress_table: str,
    context: TransactionContext,
    table_name: str,
) -> bool:
    """Insert the batch's progress row in the open transaction; ``False`` if it is there already
    (committed by another attempt)."""
    from psycopg import sql

    # Claiming the batch first holds its progress row's lock: a concurrent attempt at the same
    # batch waits, then finds it committed.
    claimed = connection.execute(
        sql.SQL(
            "INSERT INTO {} (sink_id, batch_id, target_table) VALUES (%s, %s, %s) "
            "ON CONFLICT DO NOTHING"
        ).format(_identifier(progress_table)),
        [context.sink_id, context.batch_id, table_name],
    ).rowcount
    return claimed != 0


def record_batch(
    connection: psycopg.Connection[Any],
    progress_table: str,
    context: TransactionContext,
    rows: int,
) -> None:
    """Record the batch's row count in its progress row, and drop the sink's rows older than the
    last ``PROGRESS_ROWS_KEPT`` batches, in the open transaction."""
    from psycopg import sql

    progress = _identifier(progress_table)
    connection.execute(
        sql.SQL("UPDATE {} SET row_count = %s WHERE sink_id = %s AND batch_id = %s").format(
            progress
        ),
        [rows, context.sink_id, context.batch_id],
    )
    connection.execute(
        sql.SQL("DELETE FROM {} WHERE sink_id = %s AND batch_id < %s").format(progress),
        [context.sink_id, context.batch_id - PROGRESS_ROWS_KEPT],
    )
