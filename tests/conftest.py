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

from tests.support.streaming_harness import (  # noqa: E402
    PROVIDER_UNDER_TEST,
    REFERENCE_PROVIDER,
    TEST_SETTINGS,
    session_builder,
    test_jars,
)

# Python workers (applyInPandasWithState) must run the interpreter that runs the tests.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# The query services of the tests' applications are named in a registry of the run's own, not
# the user's (the JVMs and the CLI processes the tests start inherit it).
os.environ["KEYEDSTATE_SERVICE_REGISTRY"] = tempfile.mkdtemp(prefix="keyedstate-services-")
atexit.register(shutil.rmtree, os.environ["KEYEDSTATE_SERVICE_REGISTRY"], True)


def pytest_report_header() -> list[str]:
    return [
        f"keyedstate tests: provider under test = {PROVIDER_UNDER_TEST}",
        f"keyedstate tests: reference provider  = {REFERENCE_PROVIDER}",
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

    settings = {**TEST_SETTINGS, "spark.jars": ",".join(test_jars())}
    yield from _running(ConnectServer(settings=settings))


@pytest.fixture(scope="session")
def connect_session(connect_server: Any) -> Iterator[Any]:  # noqa: ANN401
    """A Spark Connect client session of ``connect_server``, for the whole test session."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(connect_server.url).getOrCreate()
    yield session
    session.stop()


# PySpark's functions and column helpers build Connect expressions while this is set. PySpark
# sets it for the whole process once a Connect session is made through SparkSession.builder; the
# tests set it only around a test that uses the Connect session, so the classic tests of the
# same process still get classic ones.
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


@pytest.fixture
def connect_spark(connect_session: Any) -> Iterator[Any]:  # noqa: ANN401
    """The Connect session, with PySpark in Connect mode for the test."""
    before = os.environ.get(_CONNECT_MODE)
    os.environ[_CONNECT_MODE] = "1"
    try:
        yield connect_session
    finally:
        if before is None:
            os.environ.pop(_CONNECT_MODE, None)
        else:
            os.environ[_CONNECT_MODE] = before


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
