"""A driver script run by a test as its own process (tests/support/drivers/), which the test may
SIGKILL: ``Driver`` starts it in a process group of its own with its output in a log file, and
``wait_for`` waits for a condition while it lives."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.streaming_harness import kill_process_group

POLL_S = 0.02


class Driver:
    """One run of a driver script in its own session (process group)."""

    def __init__(
        self,
        args: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        *,
        script: Path,
    ) -> None:
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self) -> None:
        kill_process_group(self.proc)
        self._log_file.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log_file.close()

    def tail(self, n: int = 40) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def wait_for(driver: Driver, condition: Callable[[], bool], what: str, timeout: float) -> None:
    """Poll ``condition`` until it holds; an AssertionError naming ``what`` with the driver's
    log tail if the driver exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        if not driver.alive():
            raise AssertionError(
                f"driver exited (rc={driver.proc.returncode}) before {what}:\n{driver.tail()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{driver.tail()}")
        time.sleep(POLL_S)
