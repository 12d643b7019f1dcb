"""keyedstate's build backend: setuptools', refusing a wheel or an sdist without every provider jar.

The package runs on every Spark minor version it supports because it carries one provider jar
per version (``python/keyedstate/jars/keyedstate-spark-<minor>.jar``, built by ``make jars``); a
wheel built from a checkout without them would install and then fail at the first session. So
building one (``pip install .``, ``pip wheel .``, ``python -m build``) stops here, naming the
missing jars and the command that builds them. An editable install (``pip install -e .``, which
``make setup`` runs before it builds the jars) reads the jars from the checkout when they are
used, and is not checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - the hooks this module does not change

PACKAGE = Path("python") / "keyedstate"


def supported_spark() -> list[str]:
    """``SUPPORTED_SPARK`` of keyedstate/_session.py, read as text: the package is not importable
    in the isolated build environment (no pyspark there)."""
    text = (PACKAGE / "_session.py").read_text(encoding="utf-8")
    found = re.search(r"^SUPPORTED_SPARK = \(([^)]*)\)", text, re.M)
    if found is None:
        raise SystemExit(f"keyedstate build: no SUPPORTED_SPARK in {PACKAGE / '_session.py'}")
    return re.findall(r'"([\d.]+)"', found.group(1))


def check_jars() -> None:
    missing = [
        f"keyedstate-spark-{minor}.jar"
        for minor in supported_spark()
        if not (PACKAGE / "jars" / f"keyedstate-spark-{minor}.jar").is_file()
    ]
    if missing:
        raise SystemExit(
            f"keyedstate build: {PACKAGE / 'jars'} lacks {', '.join(missing)}: the package carries "
            "the provider jar of every Spark version it supports. Build them with `make jars` "
            "(Java 17; sbt comes with the checkout), then build the package again."
        )


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    check_jars()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    check_jars()
    return _setuptools.build_sdist(sdist_directory, config_settings)
