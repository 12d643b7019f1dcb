"""The PostgreSQL sink's one error, and psycopg's errors during a batch turned into it: a message
naming the server, the table, the batch and what to do."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from keyedstate.errors import KeyedStateError

if TYPE_CHECKING:
    from keyedstate.sinks.postgres.connection import DriverConnection
    from keyedstate.sinks.two_phase_commit import TransactionContext


class PostgresSinkError(KeyedStateError, RuntimeError):
    """A PostgreSQL sink could not be set up or could not write a batch; the message names the
    server, the object and the fix. Raised in Python, so ``error_id`` is ``None``."""


# libpq's wording around the reason, which the sink's message already says better.
_LIBPQ_NOISE = re.compile(
    r'connection failed: |connection to server at "[^"]*"(, port \d+)? failed: |FATAL:\s+'
    r"|\s*Is the server running on that host and accepting TCP/IP connections\?"
)


def first_line(error: BaseException) -> str:
    """The reason an error gives, on one line of at most 300 characters, without libpq's
    wording around it."""
    text = _LIBPQ_NOISE.sub("", str(error)).strip() or type(error).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:300]


class BatchErrors:
    """Turns a psycopg error during a batch into a PostgresSinkError naming server, table,
    batch and what to do; a lost connection is dropped so the next batch reconnects."""

    def __init__(
        self,
        connection: DriverConnection,
        table_name: str,
        context: TransactionContext,
        doing: str,
    ) -> None:
        self.connection, self.table_name = connection, table_name
        self.context, self.doing = context, doing

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: object
    ) -> bool:
        import psycopg

        if error is None or not isinstance(error, psycopg.Error):
            return False
        server, table = self.connection.server, self.table_name
        where = f"batch {self.context.batch_id} of sink {self.context.sink_id}"
        reason = first_line(error)
        if isinstance(error, psycopg.OperationalError) and self.connection.lost:
            self.connection.close()
            raise PostgresSinkError(
                f"postgres sink: lost the connection to PostgreSQL {server} while "
                f"{self.doing} ({where}, table {table}): {reason}. The server rolled "
                "the batch back; restart the query once the server is back: the batch is "
                "replayed and written once"
            ) from error
        state = getattr(error, "sqlstate", None) or "?"
        raise PostgresSinkError(
            f"postgres sink: PostgreSQL {server} refused {self.doing} ({where}, table "
            f"{table}): [{state}] {reason}. Nothing of this batch was written"
        ) from error
