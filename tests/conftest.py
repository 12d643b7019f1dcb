"""One local SparkSession for the whole pytest session, built through keyedstate.configure."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

# Without an install (`pip install -e .`), test the package from this checkout.
if importlib.util.find_spec("keyedstate") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from tests.support import jvm_class_archive, tiers  # noqa: E402
from tests.support.streaming_harness import (  # noqa: E402
    PROVIDER_UNDER_TEST,
    REFERENCE_PROVIDER,
    TEST_SETTINGS,
    extra_jars,
    session_builder,
)

# Python workers (applyInPandasWithState) must run the interpreter that runs the tests.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# The query services of the tests' applications are named in a registry of the run's own, not
# the user's (the JVMs and the CLI processes the tests start inherit it).
os.environ["KEYEDSTATE_SERVICE_REGISTRY"] = tempfile.mkdtemp(prefix="keyedstate-services-")
atexit.register(shutil.rmtree, os.environ["KEYEDSTATE_SERVICE_REGISTRY"], True)


_class_archive = "not set up"


def pytest_configure(config: pytest.Config) -> None:
    global _class_archive
    _class_archive = jvm_class_archive.use_for_spark_jvms()


def pytest_report_header() -> list[str]:
    return [
        f"keyedstate tests: provider under test = {PROVIDER_UNDER_TEST}",
        f"keyedstate tests: reference provider  = {REFERENCE_PROVIDER}",
        f"keyedstate tests: JVM class archive   = {_class_archive}",
    ]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = session_builder("keyedstate-tests").getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(scope="session")
def provider_under_test() -> str:
    return PROVIDER_UNDER_TEST


@pytest.fixture(scope="session")
def reference_provider() -> str:
    return REFERENCE_PROVIDER


def _running(server: Any) -> Iterator[Any]:  # noqa: ANN401 - a test server
    """A session fixture's server: started, yielded, closed after the session."""
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """A PostgreSQL server on 127.0.0.1 (tests/support/servers/postgres_server.py), started on
    first use and removed after the session."""
    from tests.support.servers.postgres_server import PostgresServer

    yield from _running(PostgresServer())


@pytest.fixture(scope="session")
def connect_server() -> Iterator[object]:
    """A Spark Connect server with keyedstate in it, on 127.0.0.1 (``keyedstate connect-server``;
    tests/support/servers/connect_server.py), started on first use and stopped after the session."""
    from tests.support.servers.connect_server import ConnectServer

    settings = {**TEST_SETTINGS, "spark.jars": ",".join(extra_jars())}
    yield from _running(ConnectServer(settings=settings))


@pytest.fixture(scope="session")
def connect_session(connect_server: Any) -> Iterator[Any]:  # noqa: ANN401
    """A Spark Connect client session of ``connect_server``, for the whole test session."""
    from tests.support.connect_mode import connect_session as new_session

    session = new_session(connect_server.url)
    yield session
    session.stop()


@pytest.fixture(scope="session", params=["classic", "connect"])
def spark_mode(request: pytest.FixtureRequest) -> str:
    """The state API's and the supervisor's tests run in both modes: a folder's conftest
    (tests/api, tests/runtime) makes its session fixture depend on this."""
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the Connect runs of the tests marked ``classic_only``; skips, in CI, the tests
    of the full tier (tests/support/tiers.py), naming it."""
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_connect = callspec is not None and callspec.params.get("spark_mode") == "connect"
        (dropped if on_connect and item.get_closest_marker("classic_only") else kept).append(item)
        reason = None if tiers.FULL else tiers.full_tier_reason(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"full tier (make test-full): {reason}"))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def connect_spark(connect_session: Any) -> Iterator[Any]:  # noqa: ANN401
    """The Connect session, with PySpark in Connect mode for the test
    (tests/support/connect_mode.py)."""
    from tests.support.connect_mode import connect_mode

    with connect_mode():
        yield connect_session


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[object]:
    """A single-node KRaft Kafka broker on 127.0.0.1 (tests/support/servers/kafka_broker.py;
    jars from `make connectors`), started on first use and removed after the session."""
    from tests.support.servers.kafka_broker import KafkaBroker

    yield from _running(KafkaBroker())


@pytest.fixture(scope="session")
def hdfs_cluster() -> Iterator[object]:
    """An HDFS MiniDFSCluster with 3 datanodes on 127.0.0.1
    (tests/support/servers/hdfs_cluster.py; jars from `make storage`), started on first use and
    removed after the session."""
    from tests.support.servers.hdfs_cluster import HdfsCluster

    yield from _running(HdfsCluster(datanodes=3))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[object]:
    """moto's S3 server on 127.0.0.1 with one bucket (tests/support/servers/s3_endpoint.py; s3a
    jars from `make storage`), started on first use and stopped after the session."""
    from tests.support.servers.s3_endpoint import S3Endpoint

    yield from _running(S3Endpoint())


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Spark standalone master and two one-core workers, on 127.0.0.1 and 127.0.0.2
    (tests/support/servers/spark_standalone.py), started on first use and stopped after the
    session."""
    from tests.support.servers.spark_standalone import StandaloneCluster

    yield from _running(StandaloneCluster(tmp_path_factory.mktemp("standalone-cluster")))


@pytest.fixture
def drivers() -> Iterator[list[Any]]:
    """Driver processes a test starts (tests/support/driver_process.py's ``Driver``); any still
    alive at the end has its process group killed."""
    started: list[Any] = []
    yield started
    for driver in started:
        if driver.alive():
            driver.kill_group()
