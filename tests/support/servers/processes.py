"""The life cycles the test servers share.

``DaemonServer``: a server process in its own process group that logs to a file under its own
temporary directory (PostgreSQL, the Kafka broker): started and polled until it answers,
SIGKILLed for outages, stopped by a signal, removed with its directory.

``LineServer``: a launcher process the tests talk to in lines (the HDFS minicluster, the S3
endpoint): a command on its stdin, an answer on its stdout; the end of its stdin ends it.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

Server = TypeVar("Server", bound="DaemonServer")


class DaemonServer:
    """A server process with its data and its log (``log_path``) under ``root``.

    A subclass sets ``NAME`` (for errors), ``STOP_SIGNAL`` and ``STOP_TIMEOUT_S`` (its graceful
    shutdown; SIGKILL after that long), ``START_TIMEOUT_S``, ``root``, ``log_path`` and
    ``process`` (None until started); its ``_prepare`` makes the data directory and its ``_run``
    starts the server with ``_launch`` and waits with ``_wait_ready``.
    """

    NAME = "the server"
    STOP_SIGNAL = signal.SIGTERM
    STOP_TIMEOUT_S = 20.0
    START_TIMEOUT_S = 60.0

    root: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None
    _prepared = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _launch(self, command: list[str], **popen: Any) -> None:  # noqa: ANN401 - Popen's
        """Start ``command`` in its own process group (a Ctrl-C of the tests does not reach it,
        and ``kill()`` takes its children too), its output appended to ``log_path``."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **popen
        )
        log.close()

    def _wait_ready(
        self,
        ready: Callable[[], bool],
        retry_on: type[Exception] | tuple[type[Exception], ...],
        pause_s: float,
        where: str,
    ) -> None:
        """Poll ``ready()`` (a ``retry_on`` error is a no) every ``pause_s`` until it says yes;
        an error if the process exits first or START_TIMEOUT_S passes (``where`` names the
        server's address in it)."""
        deadline = time.monotonic() + self.START_TIMEOUT_S
        last = ""  # text, not the exception: its traceback would keep clients alive
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.NAME} exited with {self.process.returncode} on start "
                    f"(log {self.log_path}): {self.log_tail()}"
                )
            try:
                if ready():
                    return
            except retry_on as error:  # refused while starting, or not serving yet
                last = str(error)
            time.sleep(pause_s)
        raise RuntimeError(
            f"{self.NAME} on {where} not ready in {self.START_TIMEOUT_S}s: {last}; "
            f"log {self.log_path}: {self.log_tail()}"
        )

    def kill(self) -> None:
        """SIGKILL the whole process group (an outage, not a shutdown); ``start()`` brings it
        back."""
        if not self.running:
            return
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        """Graceful shutdown (STOP_SIGNAL); SIGKILL if it takes over STOP_TIMEOUT_S."""
        if not self.running:
            return
        assert self.process is not None
        self.process.send_signal(self.STOP_SIGNAL)
        try:
            self.process.wait(self.STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def close(self) -> None:
        """Stop and remove the directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self) -> None:
        """Start (or restart after ``stop``/``kill``: same ports, same data) and wait until it
        answers; the data directory is made on the first start."""
        if self.running:
            return
        if not self._prepared:
            self._prepare()
            self._prepared = True
        self._run()

    def _prepare(self) -> None:
        """Make the data directory (once, before the first start)."""

    def _run(self) -> None:
        """``_launch`` the server and ``_wait_ready`` for it."""
        raise NotImplementedError

    def __enter__(self: Server) -> Server:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class LineServer:
    """A launcher process that reads commands from its stdin, one a line, and answers each on
    its stdout with a line: ``OK ...`` or an error. Its first line is ``READY ...``; the end of
    its stdin ends it.

    A subclass sets ``NAME`` (for errors), ``COMMAND_TIMEOUT_S`` and ``CLOSE_TIMEOUT_S``, starts
    the process with ``_launch`` and reads its first answer with ``_expect("READY", ...)``.
    """

    NAME = "the server"
    COMMAND_TIMEOUT_S = 30.0
    CLOSE_TIMEOUT_S = 15.0

    process: subprocess.Popen[str] | None
    _lines: queue.Queue[str]

    def _launch(self, command: list[str], **popen: Any) -> None:  # noqa: ANN401 - Popen's
        """Start ``command`` with piped stdin and stdout, and a thread reading its answers."""
        self._lines = queue.Queue()
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **popen
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self._lines.put(line.strip())
        self._lines.put("EOF")

    def _failure_detail(self) -> str:
        """More for the error of an unexpected answer (a log's tail), or ""."""
        return ""

    def _expect(self, prefix: str, timeout: float) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.NAME} did not answer in {timeout}s") from None
        if not line.startswith(prefix):
            raise RuntimeError(
                f"{self.NAME} answered {line!r}, expected {prefix}{self._failure_detail()}"
            )
        return line

    def _command(self, command: str, timeout: float | None = None) -> str:
        """Send ``command``; its ``OK`` answer (COMMAND_TIMEOUT_S unless ``timeout``)."""
        if self.process is None or self.process.stdin is None:
            raise RuntimeError(f"{self.NAME} is not running")
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._expect("OK", self.COMMAND_TIMEOUT_S if timeout is None else timeout)

    def _end(self) -> None:
        """End the process: close its stdin, wait CLOSE_TIMEOUT_S, else kill it."""
        if self.process is None:
            return
        process, self.process = self.process, None
        try:
            if process.stdin is not None:
                process.stdin.close()  # the launcher ends (and shuts its servers down) at EOF
            process.wait(timeout=self.CLOSE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait(timeout=15)
