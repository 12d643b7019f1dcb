"""A throwaway PostgreSQL server for the tests: 127.0.0.1, a free port, a fresh data directory.

The binaries come from the ``pgserver`` wheel (PostgreSQL 16, bundled; in the ``test`` extra), so
a fresh machine needs no system package; ``KEYEDSTATE_POSTGRES_BIN`` points at another ``bin``
directory, and Debian's ``/usr/lib/postgresql/*/bin`` is the fallback. PostgreSQL refuses to run
as root (CI runs as root): then it runs as an unprivileged system user created on first use.

``kill()`` SIGKILLs the whole server (postmaster and backends) for outage tests; ``start()``
brings it back on the same port and data directory.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pwd
import secrets
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.servers.ports import free_port
from tests.support.servers.processes import DaemonServer

SERVICE_USER = "keyedstate-pg"  # the system user the server runs as when the tests run as root
START_TIMEOUT_S = 60.0


def postgres_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres``."""
    configured = os.environ.get("KEYEDSTATE_POSTGRES_BIN")
    candidates = [Path(configured)] if configured else []
    spec = importlib.util.find_spec("pgserver")  # found, not imported: only its files are used
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin")
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    candidates += list(reversed(debian))
    for candidate in candidates:
        if (candidate / "postgres").is_file() and (candidate / "initdb").is_file():
            return candidate
    raise RuntimeError(
        "no PostgreSQL server binaries: install the test extra (pip install -e '.[test]', which "
        "brings pgserver) or set KEYEDSTATE_POSTGRES_BIN to a directory with initdb and postgres"
    )


def _service_account() -> pwd.struct_passwd | None:
    """None when not root; else the unprivileged user to run PostgreSQL as (created once)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        pass
    done = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return pwd.getpwnam(SERVICE_USER)  # also fine if a concurrent useradd won
    except KeyError:
        raise RuntimeError(
            f"cannot create system user {SERVICE_USER!r} to run PostgreSQL (it refuses root): "
            f"{done.stderr.strip()}"
        ) from None


def _make_traversable(path: Path) -> None:
    """Let the service user reach ``path``: add o+x to parent directories that lack it."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


def _refused() -> type[Exception]:
    """psycopg's error for a server that does not accept connections yet."""
    import psycopg

    return psycopg.OperationalError


class PostgresServer(DaemonServer):
    """One PostgreSQL server in its own temporary directory; ``close()`` stops and removes it."""

    NAME = "PostgreSQL"
    STOP_SIGNAL = signal.SIGINT  # fast shutdown: rolls back open transactions
    STOP_TIMEOUT_S = 15.0
    START_TIMEOUT_S = START_TIMEOUT_S

    def __init__(self, port: int | None = None) -> None:
        self.bin_dir = postgres_bin_dir()
        self.account = _service_account()
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.user = "postgres"
        self.password = secrets.token_hex(12)
        self.dbname = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="keyedstate-pg-"))
        self.data_dir = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None
        atexit.register(self.close)

    # -- connection details --------------------------------------------------------------------

    def params(self, **overrides: Any) -> dict[str, Any]:  # noqa: ANN401 - libpq keywords
        """Keyword arguments for ``psycopg.connect`` and ``keyedstate.sinks.postgres``."""
        base = dict(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=self.dbname,
        )
        return {**base, **overrides}

    def connect(self, **overrides: Any) -> Any:  # noqa: ANN401 - a psycopg.Connection
        import psycopg

        return psycopg.connect(**self.params(**overrides), connect_timeout=5, autocommit=True)

    def execute(self, statement: str, dbname: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit; the rows it returns, if any."""
        with self.connect(**({"dbname": dbname} if dbname else {})) as connection:
            cursor = connection.execute(statement)  # type: ignore[arg-type]
            return list(cursor.fetchall()) if cursor.description else []

    # -- life cycle ------------------------------------------------------------------------------

    def _run_as(self) -> dict[str, Any]:
        if self.account is None:
            return {}
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def _prepare(self) -> None:
        """``initdb`` the data directory."""
        self.data_dir.mkdir()
        password_file = self.root / "password"
        password_file.write_text(self.password + "\n")
        if self.account is not None:
            _make_traversable(self.bin_dir)
            _make_traversable(self.root)
            for path in (self.root, self.data_dir, password_file):
                os.chown(path, self.account.pw_uid, self.account.pw_gid)
        done = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                self.user,
                "--pwfile",
                str(password_file),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            check=False,
            **self._run_as(),
        )
        password_file.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr.strip()[-2000:]}")

    def _run(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._launch(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-c",
                f"listen_addresses={self.host}",
                "-c",
                f"unix_socket_directories={self.data_dir}",
                # A killed server is a killed process, not a lost machine: no fsync needed. The
                # sinks' commits are synchronous (SET LOCAL): a kill must not lose them, and
                # this default proves they do not depend on the server's.
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=40",
                "-c",
                "shared_buffers=32MB",
            ],
            **self._run_as(),
        )  # in its own process group: kill() takes the backends too
        self._wait_ready(self._accepts, _refused(), 0.1, f"{self.host}:{self.port}")

    def _accepts(self) -> bool:
        import psycopg

        with psycopg.connect(**self.params(), connect_timeout=2):
            return True
