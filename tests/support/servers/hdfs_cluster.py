"""A throwaway HDFS for the storage tests: Hadoop's MiniDFSCluster (3 datanodes by default) in
its own Java process (dev/storage/MiniHdfs.java, run by Java's single-file source launcher), on
127.0.0.1 with free ports and a fresh directory.

The jars come from Maven Central through ``make storage`` (dev/storage/hdfs-minicluster/pom.xml,
copied to build/storage/hdfs-minicluster/). The cluster's log goes to ``cluster.log`` in its
directory. Spark needs nothing extra: pyspark's Hadoop client (3.5.0, the cluster's version)
speaks ``hdfs://``. ``stop_datanode(n)``/``restart_datanode(n)`` take one datanode down and
back (same ports and blocks) for outage tests, and ``hold_writes(regex)``/``await_held_write()``/
``release_writes()`` hold the upload of one file in flight so that a datanode can be stopped
mid-upload deterministically; listings go through WebHDFS on the namenode's HTTP port.
"""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.paths import REPO
from tests.support.servers.ports import java_executable, maven_jars
from tests.support.servers.processes import LineServer

JARS_DIR = REPO / "build" / "storage" / "hdfs-minicluster"
LAUNCHER = REPO / "dev" / "storage" / "MiniHdfs.java"
START_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 60.0

LOG4J = """\
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d %p %c{{1}}: %m%n
"""


def cluster_jars_dir() -> Path:
    """The directory of the minicluster's jars; a clear error naming the make target if
    missing."""
    return maven_jars(
        "KEYEDSTATE_HDFS_JARS", JARS_DIR, "hadoop-hdfs-*-tests.jar",
        "hadoop-hdfs (and its tests jar)", "HDFS minicluster",
    )


class HdfsCluster(LineServer):
    """One MiniDFSCluster in its own temporary directory; ``close()`` stops it and removes the
    directory."""

    NAME = "the HDFS minicluster"
    COMMAND_TIMEOUT_S = COMMAND_TIMEOUT_S
    CLOSE_TIMEOUT_S = 30.0

    def __init__(self, datanodes: int = 3, heap: str = "512m") -> None:
        self.jars_dir = cluster_jars_dir()
        self.java = java_executable("the HDFS minicluster")
        self.datanodes = datanodes
        self.heap = heap
        self.root = Path(tempfile.mkdtemp(prefix="keyedstate-hdfs-"))
        self.log_path = self.root / "cluster.log"
        self.process: subprocess.Popen[str] | None = None
        self.namenode_uri = ""  # hdfs://127.0.0.1:<port>, once started
        self.http_address = ""
        self.datanode_addresses: list[str] = []  # "<host>:<data transfer port>", by number
        atexit.register(self.close)

    def uri(self, path: str) -> str:
        """``hdfs://127.0.0.1:<port>/<path>``."""
        return f"{self.namenode_uri}/{path.lstrip('/')}"

    def hadoop_settings(self) -> dict[str, str]:
        """Client settings: none needed beyond the URI (kept for symmetry with S3)."""
        return {}

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        log4j = self.root / "log4j.properties"
        log4j.write_text(LOG4J.format(log=self.log_path))
        self._launch(
            [
                self.java,
                f"-Xmx{self.heap}",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",  # starts sooner; a test cluster never gets hot
                "-Djava.awt.headless=true",
                f"-Dlog4j.configuration=file:{log4j}",
                "-cp",
                f"{self.jars_dir}/*",
                str(LAUNCHER),
                str(self.root / "data"),
                str(self.datanodes),
            ],
            stderr=(self.root / "launcher.err").open("w"),
            cwd=self.root,
        )
        ready = json.loads(self._expect("READY", START_TIMEOUT_S).split(" ", 1)[1])
        self.namenode_uri = ready["uri"]
        self.http_address = ready["http"]
        self.datanode_addresses = list(ready["datanodes"])

    def _failure_detail(self) -> str:
        return ":\n" + (self.root / "launcher.err").read_text(errors="replace")[-3000:]

    def stop_datanode(self, n: int) -> None:
        """Shut datanode ``n`` (0-based, numbering of the start) down."""
        self._command(f"stop-datanode {n}")

    def restart_datanode(self, n: int) -> None:
        """Bring stopped datanode ``n`` back with its ports and blocks."""
        self._command(f"restart-datanode {n}")

    def hold_writes(self, path_regex: str) -> None:
        """Hold the next upload of a file whose path (``/a/b``, no scheme) matches ``path_regex``:
        each datanode of its pipeline stops after the first packet, unacknowledged, until
        ``release_writes()`` (or its own shutdown). Other files pass. See dev/storage/MiniHdfs.java
        (``WriteHold``)."""
        self._command(f"hold-writes {path_regex}")

    def await_held_write(self, timeout_s: float = 60.0) -> dict[str, object]:
        """Wait until a write is held; returns its ``path``, ``block`` and ``pipeline`` (datanode
        numbers, the client's first)."""
        answer = self._command(f"await-held {timeout_s}", timeout=timeout_s + COMMAND_TIMEOUT_S)
        return dict(json.loads(answer.split(" ", 1)[1]))

    def release_writes(self) -> None:
        """Let held writes go on, and hold nothing more."""
        self._command("release-writes")

    def live_datanodes(self) -> list[str]:
        return list(json.loads(self._command("datanodes").split(" ", 1)[1]))

    def close(self) -> None:
        self._end()  # the launcher shuts the cluster down at the end of its stdin
        shutil.rmtree(self.root, ignore_errors=True)

    # -- inspection ------------------------------------------------------------------------------

    def block_locations(self, path: str) -> list[list[str]]:
        """For each block of the file at ``path`` (``/a/b``), the datanodes holding a replica
        (``host:port``, the data transfer port), through WebHDFS."""
        url = (
            f"http://{self.http_address}/webhdfs/v1{urllib.parse.quote(path)}"
            "?op=GETFILEBLOCKLOCATIONS"
        )
        with urllib.request.urlopen(url, timeout=30) as response:
            blocks = json.load(response)["BlockLocations"]["BlockLocation"]
        return [list(block["names"]) for block in blocks]

    def list_names(self, uri: str) -> list[str]:
        """Names of the entries directly under ``uri`` (an ``hdfs://`` directory; [] if it does
        not exist), through WebHDFS."""
        path = urllib.parse.urlparse(uri).path or "/"
        url = f"http://{self.http_address}/webhdfs/v1{urllib.parse.quote(path)}?op=LISTSTATUS"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                statuses = json.load(response)["FileStatuses"]["FileStatus"]
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise
        return sorted(s["pathSuffix"] for s in statuses)
