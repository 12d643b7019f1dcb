"""Where things are in the checkout, for tests that start scripts, compile sources or read files
by path."""

from __future__ import annotations

import re
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parent.parent
PYTHON_SOURCES = REPO / "python"  # the keyedstate package's folder
DOCS = REPO / "docs"
DRIVERS = SUPPORT / "drivers"  # scripts a test runs as its own process
JVM_SOURCES = SUPPORT / "jvm"  # Java sources a test compiles against pyspark's jars


def makefile_words(name: str) -> list[str]:
    """The words of the Makefile's ``NAME := ...`` (the Spark releases it installs, say)."""
    found = re.search(rf"^{name} := (.*)$", (REPO / "Makefile").read_text(), re.M)
    assert found, f"the Makefile sets no {name}"
    return found.group(1).split()
