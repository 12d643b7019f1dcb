"""The sink's connection to PostgreSQL, on the driver: its parameters (keywords and a libpq
conninfo), one connection kept between batches and checked before each, and what a failed
connect says."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from keyedstate.sinks.postgres.errors import PostgresSinkError, first_line

if TYPE_CHECKING:
    import psycopg

LOG = logging.getLogger(__package__)  # the sink's one logger: keyedstate.sinks.postgres


def connection_params(connection: dict[str, Any], connect_timeout_s: int) -> dict[str, Any]:
    """``psycopg.connect``'s keywords from the sink's: a conninfo's own settings win over the
    keywords' defaults."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    keywords = {k: v for k, v in connection.items() if k != "conninfo" and v is not None}
    given = conninfo_to_dict(make_conninfo(connection.get("conninfo") or ""))
    params: dict[str, Any] = {**keywords, **given}
    params.setdefault("connect_timeout", connect_timeout_s)
    params["application_name"] = "keyedstate-sink"
    return params


class DriverConnection:
    """The driver's connection: kept between batches, reconnecting if the server went away since
    the last one. It does not travel: a pickled copy connects again."""

    def __init__(self, connection: dict[str, Any], connect_timeout_s: int) -> None:
        self.params = connection_params(connection, connect_timeout_s)
        self.connect_timeout_s = connect_timeout_s
        self.server = f"{self.params.get('host', '?')}:{self.params.get('port', 5432)}"
        self._connection: psycopg.Connection[Any] | None = None

    def connect(self) -> psycopg.Connection[Any]:
        """The connection, checked with a ``SELECT 1``; a new one if it was lost."""
        import psycopg

        if self._connection is not None:
            try:
                if not self._connection.closed:
                    self._connection.execute("SELECT 1")
                    self._connection.rollback()
                    return self._connection
            except psycopg.Error:
                pass
            self.close()
        try:
            self._connection = psycopg.connect(**self.params)
        except psycopg.OperationalError as error:
            raise PostgresSinkError(self._failure(error)) from error
        return self._connection

    @property
    def lost(self) -> bool:
        """No connection, or one psycopg found broken."""
        return self._connection is None or self._connection.broken

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except Exception:  # a broken connection may fail to close; it is dropped anyway
                LOG.debug("closing a broken connection failed", exc_info=True)
            self._connection = None

    def _failure(self, error: Exception) -> str:
        reason = first_line(error)
        user, dbname = self.params.get("user"), self.params.get("dbname")
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

    def __getstate__(self) -> dict[str, Any]:
        # A connection does not travel; a copy of the sink reconnects.
        state = dict(self.__dict__)
        state["_connection"] = None
        return state
