"""A Spark Connect server with keyedstate in it, as a user starts one: ``keyedstate
connect-server`` (pyspark's ``sbin/start-connect-server.sh --wait`` with keyedstate's jar,
planner, plugins and relations), on 127.0.0.1 and a free port, its executors' Python workers on
this Python; started on first use, stopped by SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tests.support.paths import PYTHON_SOURCES, REPO
from tests.support.servers.ports import free_port
from tests.support.servers.processes import DaemonServer


class ConnectServer(DaemonServer):
    NAME = "the Spark Connect server"
    STOP_SIGNAL = signal.SIGTERM
    STOP_TIMEOUT_S = 30.0
    START_TIMEOUT_S = 120.0

    def __init__(self, master: str = "local[2]", settings: Mapping[str, str] | None = None) -> None:
        self.master = master
        self.settings = dict(settings or {})
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="keyedstate-connect-"))
        self.log_path = self.root / "server.log"
        self.process = None

    def stop(self) -> None:
        """SIGTERM to the whole process group: the launcher's shell script does not pass its
        signal on to the server's JVM (its child); SIGKILL to what is left after
        STOP_TIMEOUT_S."""
        if self.process is None:
            return  # never started, or stopped already
        group = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, self.STOP_SIGNAL)
        deadline = time.monotonic() + self.STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            self.process.poll()  # reaps the launcher once it exits (a zombie still counts)
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break  # every process of the group is gone
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        self.process.wait(30)
        self.process = None  # its group id is not signalled again (it may be reused)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def _run(self) -> None:
        settings = {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            **self.settings,
            "spark.driver.host": "127.0.0.1",
            "spark.local.dir": str(self.root / "local"),
        }
        command = [
            sys.executable, "-m", "keyedstate.tools.cli", "connect-server",
            "--port", str(self.port), "--master", self.master,
        ]  # fmt: skip
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(PYTHON_SOURCES), str(REPO)]),
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_PID_DIR=str(self.root),
        )
        self._launch(command, env=env, cwd=self.root)

        def answers() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True

        try:
            self._wait_ready(answers, OSError, 0.5, self.url)
        except BaseException:
            self.stop()  # its JVM would outlive the tests otherwise (a session of its own)
            raise
