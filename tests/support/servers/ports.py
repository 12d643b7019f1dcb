"""What the test servers share: a free port on 127.0.0.1, and the Java and the jars to run the JVM
ones."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def java_executable(server: str) -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on the PATH; ``server`` names who needs it."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.is_file():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise RuntimeError(f"no `java` on PATH (nor JAVA_HOME): {server} needs Java 17")
    return found


def maven_jars(variable: str, default: Path, marker: str, holding: str, what: str) -> Path:
    """The directory of a JVM server's jars: ``$variable``, else ``default``
    (``build/<target>/<name>``, which ``make <target>`` fills from ``dev/<target>/<name>/pom.xml``).
    It must hold a jar matching ``marker``; else an error naming ``what`` is missing and how to get
    it (the make target, or the variable set to a directory ``holding`` them)."""
    configured = os.environ.get(variable)
    directory = Path(configured) if configured else default
    if not any(directory.glob(marker)):
        target, name = default.parent.name, default.name
        raise RuntimeError(
            f"{what} jars not found in {directory}: run `make {target}` (Maven fetches "
            f"them from Maven Central as listed in dev/{target}/{name}/pom.xml), or set "
            f"{variable} to a directory holding {holding}"
        )
    return directory
