"""SparkSession wiring: the bundled provider jar and the provider's options."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

PROVIDER_CLASS = "io.keyedstate.KeyedStateStoreProvider"
PROVIDER_CLASS_KEY = "spark.sql.streaming.stateStore.providerClass"
# Plans the Python API's keyed functions (io.keyedstate.process): a static setting.
EXTENSIONS_CLASS = "io.keyedstate.process.KeyedStateExtensions"
EXTENSIONS_KEY = "spark.sql.extensions"
OPTION_PREFIX = "spark.sql.streaming.stateStore.keyedstate."

# Python keyword -> provider option (under OPTION_PREFIX). Documented in docs/configuration.md;
# the provider validates the values and fails the query at start on a bad one.
OPTIONS: dict[str, str] = {
    "local_dir": "localDir",
    "block_cache_size_mb": "blockCacheSizeMB",
    "write_buffer_size_mb": "writeBufferSizeMB",
    "compression": "compression",
    "track_num_keys": "trackNumKeys",
    "transfer_threads": "transferThreads",
    "verify_checksums_on_load": "verifyChecksumsOnLoad",
    "orphan_file_grace_period_ms": "orphanFileGracePeriodMs",
    "max_open_files": "maxOpenFiles",
    "changelog_checkpointing": "changelogCheckpointing",
}

_JAR_NAME = "keyedstate.jar"


def jar_path() -> str:
    """The provider jar: the one bundled in the wheel, else a local sbt build.

    ``KEYEDSTATE_JAR`` overrides both. Use the result with ``--jars`` or put it on a
    cluster's classpath.
    """
    override = os.environ.get("KEYEDSTATE_JAR")
    candidates = [Path(override)] if override else []
    candidates.append(Path(__file__).parent / "jars" / _JAR_NAME)
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    raise FileNotFoundError(
        f"keyedstate provider jar not found (looked at {', '.join(map(str, candidates))}); "
        "build it with `make jar` or set KEYEDSTATE_JAR"
    )


def _with_extensions(builder: SparkSession.Builder) -> str:
    existing = [e.strip() for e in str(builder._options.get(EXTENSIONS_KEY, "")).split(",")]
    return ",".join([e for e in existing if e and e != EXTENSIONS_CLASS] + [EXTENSIONS_CLASS])


def configure(builder: SparkSession.Builder, **options: Any) -> SparkSession.Builder:
    """Return ``builder`` with the keyedstate jar on the classpath and the provider selected.

    Keyword options are the provider's options in snake_case (see ``OPTIONS``), for
    example ``configure(builder, local_dir="/mnt/ssd/keyedstate", compression="zstd")``.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown keyedstate option(s) {unknown}; allowed: {sorted(OPTIONS)}"
        )
    builder = (
        builder.config("spark.jars", jar_path())
        .config(PROVIDER_CLASS_KEY, PROVIDER_CLASS)
        .config(EXTENSIONS_KEY, _with_extensions(builder))
    )
    for name, value in options.items():
        if isinstance(value, bool):
            value = str(value).lower()
        builder = builder.config(OPTION_PREFIX + OPTIONS[name], str(value))
    return builder
