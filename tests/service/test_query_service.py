"""The query service on the driver (docs/query-service.md), against a real running query: the
machine's registry names the service while the query runs; the service lists it and takes
savepoints of it in its own application (the state equals the checkpoint's at that batch); the
CLI given only the checkpoint asks it instead of starting Spark; every bad request gets its
error id; a stopped query without queryable state leaves no entry."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate.errors import CheckpointOperationError, QueryCheckpointError, QueryServiceError
from keyedstate.service import (
    QueryServiceClient,
    ServiceAddress,
    registry_folder,
    service_address,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from tests.support.paths import REPO
from tests.support.streaming_harness import PROVIDER_UNDER_TEST, FileInput, committed_batches

SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.LongType())])


@dataclass
class Running:
    query: StreamingQuery
    checkpoint: Path
    source: FileInput
    address: ServiceAddress

    def client(self, token: str | None = None) -> QueryServiceClient:
        return QueryServiceClient(self.address.url, token or self.address.token)

    def await_batches(self, count: int) -> None:
        deadline = time.monotonic() + 120
        while len(committed_batches(self.checkpoint)) < count:
            assert self.query.isActive and time.monotonic() < deadline, self.query.exception()
            time.sleep(0.05)


def _rows(batch: int) -> list[dict[str, Any]]:
    return [{"k": f"k{i % 7}", "v": batch * 10 + i} for i in range(20)]


def _start(
    spark: SparkSession, source: FileInput, checkpoint: Path
) -> tuple[StreamingQuery, ServiceAddress]:
    """A running aggregation on keyedstate's provider, and its service once the registry names
    it."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_UNDER_TEST)
    query = (
        source.read_stream(spark)
        .groupBy("k")
        .agg(F.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    deadline = time.monotonic() + 60
    while (address := service_address(str(checkpoint))) is None:
        assert time.monotonic() < deadline, "the registry names no service of the query"
        time.sleep(0.05)  # written on the driver right after the query starts
    return query, address


@pytest.fixture(scope="module")
def running(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    work = tmp_path_factory.mktemp("query-service")
    source = FileInput(work / "input", SCHEMA)
    source.add_all(_rows(b) for b in range(3))
    query, address = _start(spark, source, work / "checkpoint")
    result = Running(query, work / "checkpoint", source, address)
    result.await_batches(3)
    try:
        yield result
    finally:
        query.stop()


def test_the_running_query_s_checkpoint_names_the_service_that_lists_it(
    running: Running, spark: SparkSession
) -> None:
    address = running.address
    assert (address.query_id, address.run_id) == (str(running.query.id), str(running.query.runId))
    assert address.url.startswith("http://127.0.0.1:")
    assert address.application_id == spark.sparkContext.applicationId
    assert address.checkpoint.rstrip("/").endswith(str(running.checkpoint))
    entry = registry_folder() / f"{address.run_id}.json"
    assert entry.stat().st_mode & 0o777 == 0o600  # it holds the token
    assert registry_folder().stat().st_mode & 0o777 == 0o700
    assert not list(running.checkpoint.glob(".keyedstate*"))  # the checkpoint is not written to
    [listed] = [q for q in running.client().queries() if q.id == address.query_id]
    assert listed.run_id == address.run_id
    assert listed.checkpoint.rstrip("/").endswith(str(running.checkpoint))
    assert listed.last_committed_batch is not None and listed.last_committed_batch >= 2


def test_a_savepoint_asked_of_the_service_holds_the_state_of_its_batch(
    running: Running, spark: SparkSession, tmp_path: Path
) -> None:
    info = running.client().savepoint(running.address.query_id, str(tmp_path / "sp"), timeout=120)
    assert running.query.isActive  # taken beside the running query, in its application
    assert info.format == "native" and info.batch_id >= 2
    assert (tmp_path / "sp" / "_savepoint.json").is_file()
    saved = keyedstate.state.read(spark, str(tmp_path / "sp"))
    at_batch = keyedstate.state.read(spark, str(running.checkpoint), batch_id=info.batch_id)
    columns = ["key", "value"]
    assert sorted(map(tuple, saved.select(*columns).collect())) == sorted(
        map(tuple, at_batch.select(*columns).collect())
    )
    canonical = running.client().savepoint(
        running.address.query_id, str(tmp_path / "canonical"), format="canonical", timeout=120
    )
    assert canonical.format == "canonical" and canonical.operators[0].tables[0].rows == 7


def test_the_cli_given_the_checkpoint_asks_the_query_s_application(
    running: Running, tmp_path: Path
) -> None:
    target = tmp_path / "by-the-cli"
    done = subprocess.run(
        [sys.executable, "-m", "keyedstate.tools.cli", "savepoint", "create",
         "--checkpoint", str(running.checkpoint), "--target", str(target)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f"the query {running.address.query_id} runs in application "
        f"{running.address.application_id}: the savepoint is taken there" in done.stdout
    )
    assert f"savepoint written: {target} (native, batch " in done.stdout
    metadata = json.loads((target / "_savepoint.json").read_text())
    assert metadata["source"].rstrip("/").endswith(str(running.checkpoint))
    # A relative target is the CLI's (not the driver's working directory); --json prints JSON only.
    done = subprocess.run(
        [sys.executable, "-m", "keyedstate.tools.cli", "savepoint", "create",
         "--checkpoint", str(running.checkpoint), "--target", "relative", "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [info] = json.loads(done.stdout)
    assert info["path"] == str(tmp_path / "relative") and info["format"] == "native"
    assert (tmp_path / "relative" / "_savepoint.json").is_file()


def test_bad_requests_get_their_error_ids_and_the_service_keeps_serving(
    running: Running, tmp_path: Path
) -> None:
    query_id = running.address.query_id

    def refused(call: Any, error_id: str) -> str:  # noqa: ANN401 - a thunk
        with pytest.raises(QueryServiceError) as caught:
            call()
        assert caught.value.error_id == error_id, str(caught.value)
        return str(caught.value)

    wrong = running.client(token="not-the-service-token")
    message = refused(wrong.queries, "KEYEDSTATE_SERVICE_UNAUTHORIZED")
    assert "bearer token" in message and running.address.token not in message
    client = running.client()
    message = refused(
        lambda: client.trigger_savepoint(query_id, str(tmp_path / "x"), format="binary"),
        "KEYEDSTATE_SERVICE_BAD_REQUEST",
    )
    assert "'binary'" in message and "native, canonical" in message
    unknown = "00000000-0000-0000-0000-000000000000"
    message = refused(
        lambda: client.trigger_savepoint(unknown, str(tmp_path / "x")),
        "KEYEDSTATE_SERVICE_NOT_FOUND",
    )
    assert unknown in message and query_id in message
    refused(
        lambda: client.trigger_savepoint("not-a-uuid", str(tmp_path / "x")),
        "KEYEDSTATE_SERVICE_BAD_REQUEST",
    )
    refused(
        lambda: client.savepoint_status(query_id, "no-such-request"), "KEYEDSTATE_SERVICE_NOT_FOUND"
    )
    refused(lambda: client._request("GET", "/v2/elsewhere"), "KEYEDSTATE_SERVICE_NOT_FOUND")
    refused(lambda: client._request("DELETE", "/v1/queries"), "KEYEDSTATE_SERVICE_BAD_REQUEST")
    wrong_method = urllib.request.Request(
        f"{running.address.url}/v1/queries",
        method="DELETE",
        headers={"Authorization": f"Bearer {running.address.token}"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(wrong_method, timeout=10)
    assert (caught.value.code, caught.value.headers["Allow"]) == (405, "GET")
    head = urllib.request.Request(
        f"{running.address.url}/v1/queries",
        method="HEAD",
        headers={"Authorization": f"Bearer {running.address.token}"},
    )
    with urllib.request.urlopen(head, timeout=10) as answered:
        assert answered.status == 200 and answered.read() == b""

    refused(
        lambda: client._request("POST", f"/v1/queries/{query_id}/savepoints", {"target": 7}),
        "KEYEDSTATE_SERVICE_BAD_REQUEST",
    )
    message = refused(
        lambda: client.trigger_savepoint(query_id, "relative/sp"), "KEYEDSTATE_SERVICE_BAD_REQUEST"
    )
    assert "'relative/sp'" in message and "absolute path or a URI" in message
    not_json = urllib.request.Request(
        f"{running.address.url}/v1/queries/{query_id}/savepoints",
        data=b"{target:",
        method="POST",
        headers={"Authorization": f"Bearer {running.address.token}"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(not_json, timeout=10)
    answer = json.loads(caught.value.read())
    assert caught.value.code == 400 and answer["error_id"] == "KEYEDSTATE_SERVICE_BAD_REQUEST"
    assert answer["message"].startswith("The body is not JSON")
    # A savepoint the service takes and fails is the failure's own error, as in-process.
    with pytest.raises(QueryCheckpointError) as failed:
        client.savepoint(query_id, str(running.checkpoint / "inside"), timeout=60)
    assert isinstance(failed.value, CheckpointOperationError)
    assert failed.value.error_id == "KEYEDSTATE_QUERY_CHECKPOINT_INVALID"
    assert "overlap" in str(failed.value)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    message = refused(
        QueryServiceClient(closed, "x" * 16, timeout=2).queries, "KEYEDSTATE_SERVICE_UNAVAILABLE"
    )
    assert closed in message
    assert [q.id for q in client.queries()] == [query_id]  # still serving


def test_a_stopped_query_leaves_no_service_behind(spark: SparkSession, tmp_path: Path) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add(_rows(0))
    checkpoint = tmp_path / "checkpoint"
    query, address = _start(spark, source, checkpoint)
    deadline = time.monotonic() + 60
    client = QueryServiceClient(address.url, address.token)
    while not committed_batches(checkpoint):
        assert query.isActive and time.monotonic() < deadline, query.exception()
        time.sleep(0.05)
    request_id = client.trigger_savepoint(address.query_id, str(tmp_path / "before-stop"))
    client.await_savepoint(address.query_id, request_id, str(tmp_path / "before-stop"), timeout=60)
    query.stop()
    while service_address(str(checkpoint)) is not None:
        assert time.monotonic() < deadline, "the stopped query's registry entry stayed"
        time.sleep(0.05)
    # No queryable state: nothing of it is served any more (one with queryable state stays
    # served from its checkpoint, tests/service/test_queryable_state.py).
    assert service_address(str(checkpoint), stopped=True) is None
    assert address.query_id not in [q.id for q in client.queries()]
    # A request's status outlives its query.
    assert client.savepoint_status(address.query_id, request_id)["status"] == "completed"
    with pytest.raises(QueryServiceError) as caught:
        client.trigger_savepoint(address.query_id, str(tmp_path / "sp"))
    assert caught.value.error_id == "KEYEDSTATE_SERVICE_NOT_FOUND"
