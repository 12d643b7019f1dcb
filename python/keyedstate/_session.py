"""SparkSession wiring: the bundled provider jar and the provider's options."""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from keyedstate._error_catalog import INVALID_OPTION, UNSUPPORTED_SPARK_VERSION
from keyedstate.errors import InvalidOptionError

PROVIDER_CLASS = "io.keyedstate.KeyedStateStoreProvider"
PROVIDER_CLASS_KEY = "spark.sql.streaming.stateStore.providerClass"
# Plans the Python API's keyed functions (io.keyedstate.engine): a static setting.
EXTENSIONS_CLASS = "io.keyedstate.engine.KeyedStateExtensions"
# The query service (docs/query-service.md): started with the application's first streaming query.
SERVICE_EXTENSIONS_CLASS = "io.keyedstate.service.ServiceExtensions"
EXTENSIONS_KEY = "spark.sql.extensions"
ENGINE_EXTENSIONS = [EXTENSIONS_CLASS, SERVICE_EXTENSIONS_CLASS]
# Queryable state's state servers in the executors (docs/queryable-state.md).
QUERYABLE_PLUGIN_CLASS = "io.keyedstate.queryable.QueryablePlugin"
PLUGINS_KEY = "spark.plugins"
# Spark's plugins put before spark.plugins: a local Spark Connect server replaces spark.plugins
# with its own plugin (pyspark's _start_connect_server), and keeps this list.
DEFAULT_PLUGINS_KEY = "spark.plugins.defaultList"
# keyedstate's relations on Spark Connect (io.keyedstate.sparkconnect): a server's static setting.
CONNECT_RELATION_PLUGIN_CLASS = "io.keyedstate.sparkconnect.KeyedStateRelationPlugin"
CONNECT_RELATIONS_KEY = "spark.connect.extensions.relation.classes"
OPTION_PREFIX = "spark.sql.streaming.stateStore.keyedstate."
# io.keyedstate.conf.KeyedStateConf.QueryablePrefix: Spark's operators lookups read.
QUERYABLE_OPERATOR_PREFIX = OPTION_PREFIX + "queryable.operator."


def _load_options() -> dict[str, dict[str, Any]]:
    """Python keyword -> the provider option's key and rule, generated from the provider's
    option registry (io.keyedstate.conf.OptionDocs; docs/configuration.md has the same table)."""
    text = resources.files("keyedstate").joinpath("_options.json").read_text(encoding="utf-8")
    return {entry["python"]: entry for entry in json.loads(text)}


OPTIONS: dict[str, dict[str, Any]] = _load_options()

# The Spark minor versions keyedstate has a provider jar for (build.sbt: one jar per version).
SUPPORTED_SPARK = ("4.0", "4.1", "4.2", "4.3")
_NEXT_MINOR = "4.4"


def spark_minor(version: str | None = None) -> str:
    """``"4.2"`` for Spark 4.2.1: of ``version`` (a cluster's Spark), else of the installed
    pyspark. A version keyedstate has no jar for is refused naming the supported ones."""
    installed = version is None
    if version is None:
        import pyspark

        version = pyspark.__version__
    minor = ".".join(version.split(".")[:2])
    if minor not in SUPPORTED_SPARK:
        supported = ", ".join(SUPPORTED_SPARK[:-1]) + f" and {SUPPORTED_SPARK[-1]}"
        advice = (
            f"install one of those (pip install 'pyspark>={SUPPORTED_SPARK[0]},<{_NEXT_MINOR}')"
            if installed
            else "run the cluster on one of those"
        )
        raise InvalidOptionError(
            f"keyedstate has provider jars for Spark {supported}, not for Spark {version}"
            f"{' (the installed pyspark)' if installed else ''}: {advice}",
            UNSUPPORTED_SPARK_VERSION,
        )
    return minor


# Spark's Kafka source and sink per Spark minor version: the newest release of the connector on
# Maven Central for it (a minor version's patch releases link against each other). Maven Central
# has no 4.3 connector, and 4.2.0's links and runs against Spark 4.3.0 (docs/exactly-once.md,
# "Kafka connector").
KAFKA_CONNECTOR_VERSIONS = {"4.0": "4.0.4", "4.1": "4.1.3", "4.2": "4.2.0", "4.3": "4.2.0"}
PACKAGES_KEY = "spark.jars.packages"


def kafka_connector_package(spark_version: str | None = None) -> str:
    """Spark's Kafka connector package (for ``spark.jars.packages``) for a Spark version, the
    installed pyspark's by default."""
    version = KAFKA_CONNECTOR_VERSIONS[spark_minor(spark_version)]
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def with_kafka_connector(packages: str) -> str:
    """A ``spark.jars.packages`` value with the Kafka connector last, once; the others kept."""
    connector = kafka_connector_package()
    kept = [p.strip() for p in packages.split(",") if p.strip() and p.strip() != connector]
    return ",".join([*kept, connector])


def jar_path(spark_version: str | None = None) -> str:
    """The provider jar for a Spark version (the installed pyspark's by default), as the package
    bundles it: one jar per Spark minor version.

    ``KEYEDSTATE_JAR`` overrides the installed pyspark's. Use the result with ``--jars`` or put
    it on a cluster's classpath (``keyedstate jar --spark-version 4.2`` prints a cluster's).
    """
    minor = spark_minor(spark_version)
    override = os.environ.get("KEYEDSTATE_JAR")
    if override and spark_version is None:  # the running application's jar, not a cluster's
        if Path(override).is_file():
            return str(Path(override).resolve())
        raise FileNotFoundError(f"KEYEDSTATE_JAR={override} is not a file")
    bundled = Path(__file__).parent / "jars" / f"keyedstate-spark-{minor}.jar"
    if bundled.is_file():
        return str(bundled.resolve())
    built = sorted(p.name for p in bundled.parent.glob("keyedstate-spark-*.jar"))
    raise FileNotFoundError(
        f"keyedstate has no provider jar for Spark {minor} at {bundled} (this install has: "
        f"{', '.join(built) or 'none'}); in a checkout, build it with `make jar` (the installed "
        "pyspark's) or `make jars` (every supported Spark), or set KEYEDSTATE_JAR"
    )


def _with_classes(settings: Mapping[str, Any], key: str, ours: list[str]) -> str:
    """The comma-separated list (of classes, of jars) under ``key`` with ``ours`` added once."""
    existing = [e.strip() for e in str(settings.get(key, "")).split(",")]
    return ",".join([e for e in existing if e and e not in ours] + ours)


def application_settings(
    existing: Mapping[str, Any], plugins_key: str = PLUGINS_KEY
) -> dict[str, str]:
    """The settings an application needs at its start for keyedstate (the jar, the provider,
    the keyed functions' planner and the query service, queryable state's plugin, the relations
    of Spark Connect), merged into the class lists of ``existing`` settings."""
    return {
        "spark.jars": _with_classes(existing, "spark.jars", [jar_path()]),
        PROVIDER_CLASS_KEY: PROVIDER_CLASS,
        EXTENSIONS_KEY: _with_classes(existing, EXTENSIONS_KEY, ENGINE_EXTENSIONS),
        plugins_key: _with_classes(existing, plugins_key, [QUERYABLE_PLUGIN_CLASS]),
        CONNECT_RELATIONS_KEY: _with_classes(
            existing, CONNECT_RELATIONS_KEY, [CONNECT_RELATION_PLUGIN_CLASS]
        ),
    }


def _connect_remote(builder: SparkSession.Builder) -> str | None:
    """The Spark Connect server a builder's session talks to (``sc://host:port`` for one that
    runs; otherwise the master of the server it starts in this process, as ``local[2]``), or
    None for a classic session."""
    options = builder._options
    remote = options.get("spark.remote") or os.environ.get("SPARK_REMOTE")
    if remote:
        return str(remote)
    if str(options.get("spark.api.mode", "")).lower() == "connect":
        return str(options.get("spark.master", "local[*]"))
    return None


def _option_value(name: str, value: Any) -> str:  # noqa: ANN401 - any option's value
    """The setting's text for keyword ``name``, checked as the provider checks it."""
    option = OPTIONS[name]
    text = str(value).lower() if isinstance(value, bool) else str(value)
    raw = text.strip()
    kind = option["kind"]
    if kind == "integer":
        valid = (
            not isinstance(value, bool)
            and re.fullmatch(r"[+-]?\d+", raw) is not None
            and option["min"] <= int(raw) <= option["max"]
        )
    elif kind == "boolean":
        valid = raw.lower() in ("true", "false")
    elif kind == "choice":
        valid = raw.lower() in option["choices"]
    else:  # absolute_path
        valid = os.path.isabs(raw)
    if not valid:
        raise InvalidOptionError(
            f"Invalid value {value!r} for {name}= ({option['key']}): "
            f"allowed is {option['allowed']}",
            INVALID_OPTION,
        )
    return text


def queryable(df: Any, operator: int, name: str) -> Any:  # noqa: ANN401 - a DataFrame
    """Make the state of Spark's stateful operator ``operator`` (its operator id: 0 for a query's
    first, see ``keyedstate inspect``) readable by key under ``name`` (docs/queryable-state.md):
    an aggregation's values per group, a deduplication's keys, a ``(flat)mapGroupsWithState``
    state. Sets the session option ``spark.sql.streaming.stateStore.keyedstate.queryable.operator.
    <operator>`` of ``df``'s session, read when a query starts: call it before ``start()``; it
    applies to the queries the session starts from then on. Returns ``df``."""
    if isinstance(operator, bool) or not isinstance(operator, int) or operator < 0:
        raise ValueError(f"operator must be an operator id (an int from 0), got {operator!r}")
    if not isinstance(name, str) or not name.strip() or name.strip() != name or "/" in name:
        raise ValueError(
            f"name must be a non-empty str without '/' nor surrounding spaces, got {name!r}"
        )
    session = getattr(df, "sparkSession", None)
    if session is None or not getattr(df, "isStreaming", False):
        raise TypeError(f"queryable() takes a streaming DataFrame (before start()), got {df!r}")
    session.conf.set(f"{QUERYABLE_OPERATOR_PREFIX}{operator}", name)
    return df


def configure(
    builder: SparkSession.Builder, *, kafka: bool = False, **options: Any
) -> SparkSession.Builder:
    """Return ``builder`` with the keyedstate jar on the classpath and the provider selected.

    Keyword options are the provider's options in snake_case (docs/configuration.md), for
    example ``configure(builder, local_dir="/mnt/ssd/keyedstate", compression="zstd")``; each
    value is checked here, as the provider checks it. ``kafka=True`` also adds Spark's Kafka
    source and sink (``kafka_connector_package()`` to ``spark.jars.packages``, which Spark fetches
    from Maven Central when the session starts).

    On Spark Connect, a builder for a server started in this process (``.remote("local[2]")``,
    or ``spark.api.mode=connect``) gets the server's settings too; one for a server that runs
    (``sc://``) gets the session's own, and the server must have been started with the rest
    (docs/spark-connect.md).
    """
    if not isinstance(kafka, bool):
        raise ValueError(f"kafka= must be True or False, got {kafka!r}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidOptionError(
            f"unknown keyedstate option(s) {unknown}; allowed: {sorted(OPTIONS)}", INVALID_OPTION
        )
    settings = {OPTIONS[name]["key"]: _option_value(name, value) for name, value in options.items()}
    remote = _connect_remote(builder)
    if remote is not None and remote.startswith("sc://"):
        # A Spark Connect server that runs already: its static settings were made when it started
        # (docs/spark-connect.md); the session's own settings are made here.
        if kafka:
            raise ValueError(
                "kafka=True adds Spark's Kafka connector to the application: on a Spark Connect "
                f"server ({remote}) start the server with --packages {kafka_connector_package()}"
            )
        builder = builder.config(PROVIDER_CLASS_KEY, PROVIDER_CLASS)
        for key, value in settings.items():
            builder = builder.config(key, value)
        return builder
    plugins_key = PLUGINS_KEY if remote is None else DEFAULT_PLUGINS_KEY
    static = application_settings(builder._options, plugins_key)
    if remote is not None:
        # The server this process starts takes them all; PySpark then sets each again as a
        # session setting, and warns that the static ones cannot be: they were, at the start.
        # Only those warnings, of these very values, are silenced.
        for key, value in static.items():
            warnings.filterwarnings(
                "ignore",
                message=f"Failed to set {re.escape(key)} to Some\\({re.escape(value)}\\) ",
                category=UserWarning,
            )
    for key, value in static.items():
        builder = builder.config(key, value)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if kafka:
        packages = with_kafka_connector(str(builder._options.get(PACKAGES_KEY, "")))
        builder = builder.config(PACKAGES_KEY, packages)
    return builder
