"""Queryable state (docs/queryable-state.md) against a real running query: the executors' state
servers answer lookups through the driver's proxy, batch by batch equal to what the state reader
shows for the batch each answer names; a batch whose stores committed but that then failed is
never seen; bad requests get their error ids and the service keeps serving."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import Types, key_by
from keyedstate.errors import QueryServiceError
from keyedstate.service import QueryableStateClient
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from tests.support.keyed_functions import QueryableTotals
from tests.support.streaming_harness import PROVIDER_UNDER_TEST, FileInput, committed_batches

SCHEMA = T.StructType(
    [
        T.StructField("k", T.StringType()),
        T.StructField("v", T.LongType()),
        T.StructField("tag", T.StringType()),
    ]
)
OUT = "k string, total long"
KEYS = [f"user{i}" for i in range(12)]


def _rows(batch: int) -> list[dict[str, Any]]:
    return [
        {"k": KEYS[(batch * 5 + i) % len(KEYS)], "v": batch * 100 + i, "tag": f"t{i % 3}"}
        for i in range(9)
    ]


def _start(
    spark: SparkSession,
    source: FileInput,
    checkpoint: Path,
    sink: Any = None,  # noqa: ANN401
    function: Any = None,  # noqa: ANN401
) -> StreamingQuery:
    """``function`` (QueryableTotals by default) keyed by ``k`` over ``source``."""
    frame = key_by(source.read_stream(spark), "k").process(
        function or QueryableTotals(), OUT, uid="totals"
    )
    return _run(spark, frame, checkpoint, sink)


def _run(
    spark: SparkSession,
    frame: DataFrame,
    checkpoint: Path,
    sink: Any = None,  # noqa: ANN401
    mode: str = "append",
) -> StreamingQuery:
    """``frame`` running on keyedstate's provider into ``sink`` (or nowhere)."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_UNDER_TEST)
    writer = frame.writeStream.outputMode(mode).option("checkpointLocation", str(checkpoint))
    writer = writer.foreachBatch(sink) if sink is not None else writer.format("noop")
    return writer.trigger(processingTime="100 milliseconds").start()


def _client(checkpoint: Path, query: StreamingQuery) -> QueryableStateClient:
    deadline = time.monotonic() + 60
    while True:
        try:
            return QueryableStateClient.for_checkpoint(str(checkpoint))
        except QueryServiceError:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.05)


def _await_batch(checkpoint: Path, query: StreamingQuery, batch: int) -> None:
    deadline = time.monotonic() + 120
    while batch not in committed_batches(checkpoint):
        assert query.isActive and time.monotonic() < deadline, query.exception()
        time.sleep(0.05)


def _ran(spark: SparkSession, tmp_path: Path, batches: int) -> tuple[FileInput, Path]:
    """A query that ran batches 0 to ``batches - 1`` of ``_rows`` and stopped: its input and
    checkpoint."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add(_rows(0))
    checkpoint = tmp_path / "checkpoint"
    query = _start(spark, source, checkpoint)
    try:
        for batch in range(batches):
            if batch > 0:
                source.add(_rows(batch))
            _await_batch(checkpoint, query, batch)
    finally:
        query.stop()
    return source, checkpoint


def _run_batch(spark: SparkSession, source: FileInput, checkpoint: Path, batch: int) -> None:
    """Another run of the query on ``checkpoint``: batch ``batch`` of ``_rows``, then stopped."""
    query = _start(spark, source, checkpoint)
    try:
        source.add(_rows(batch))
        _await_batch(checkpoint, query, batch)
    finally:
        query.stop()


def _state_at(spark: SparkSession, checkpoint: Path, state: str, batch: int) -> dict[str, Any]:
    """State ``state`` of every key at ``batch``, as the state reader shows it."""
    frame = keyedstate.state.read(
        spark, str(checkpoint), "totals", state, batch_id=batch, flatten=False
    )
    return {row["k"]: row["value"] for row in frame.collect()}


@dataclass
class Running:
    query: StreamingQuery
    checkpoint: Path
    source: FileInput
    client: QueryableStateClient


@pytest.fixture(scope="module")
def running(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    work = tmp_path_factory.mktemp("queryable")
    source = FileInput(work / "input", SCHEMA)
    source.add(_rows(0))
    query = _start(spark, source, work / "checkpoint")
    try:
        _await_batch(work / "checkpoint", query, 0)
        yield Running(query, work / "checkpoint", source, _client(work / "checkpoint", query))
    finally:
        query.stop()


def test_lookups_equal_the_state_reader_batch_by_batch(
    running: Running, spark: SparkSession
) -> None:
    for batch in range(1, 4):
        running.source.add(_rows(batch))
        _await_batch(running.checkpoint, running.query, batch)
        asked = [*KEYS, "nobody"]
        totals = running.client.lookup("totals", asked, min_batch=batch)
        assert totals.batch >= batch and totals.query_id == str(running.query.id)
        expected = _state_at(spark, running.checkpoint, "total", totals.batch)
        assert expected, "the reader shows no state"
        assert totals.values == [expected.get(k) for k in asked]
        # Each state kind at the same batch: list, map and a pickled value.
        amounts = running.client.lookup("amounts", asked, min_batch=totals.batch)
        listed = _state_at(spark, running.checkpoint, "amounts", amounts.batch)
        assert amounts.values == [listed.get(k) for k in asked]
        tags = running.client.lookup("tags", asked, min_batch=totals.batch)
        mapped = _state_at(spark, running.checkpoint, "tags", tags.batch)
        assert tags.values == [None if mapped.get(k) is None else dict(mapped[k]) for k in asked]
        last = running.client.lookup("last", KEYS, min_batch=totals.batch)
        pickled = _state_at(spark, running.checkpoint, "last", last.batch)
        assert last.values == [pickle.loads(pickled[k]) if k in pickled else None for k in KEYS]
    assert running.client.get("totals", "nobody") is None
    assert running.client.get("tags", KEYS[0])["t0"] >= 1
    # One entry of each key's map: the same as the whole map's, at one batch.
    whole = running.client.lookup("tags", KEYS, min_batch=3)
    entry = running.client.lookup("tags", KEYS, min_batch=whole.batch, map_key="t1")
    assert entry.batch == whole.batch  # no input arrives meanwhile: no batch runs
    assert entry.values == [None if m is None else m.get("t1") for m in whole.values]
    assert running.client.get("tags", KEYS[0], map_key="no-such-tag") is None
    # This query's (earlier tests' stopped queries with queryable states are served too).
    names = {s.name: s for s in running.client.states() if s.query_id == str(running.query.id)}
    assert set(names) == {"totals", "amounts", "tags", "last"}
    assert names["totals"].key_columns == (("k", "string"),) and names["totals"].kind == "value"
    assert names["last"].pickled_value and not names["totals"].pickled_value


def test_bad_requests_get_their_error_ids_and_the_service_keeps_serving(running: Running) -> None:
    client = running.client

    def refused(call: Any, error_id: str) -> str:  # noqa: ANN401 - a thunk
        with pytest.raises(QueryServiceError) as caught:
            call()
        assert caught.value.error_id == error_id, str(caught.value)
        return str(caught.value)

    message = refused(lambda: client.get("nothing", "a"), "KEYEDSTATE_SERVICE_NOT_FOUND")
    assert "'nothing'" in message and "amounts, last, tags, totals" in message
    message = refused(lambda: client.get("totals", 7), "KEYEDSTATE_SERVICE_BAD_REQUEST")
    assert "key #0 is 7, not a string" in message and "(k string)" in message
    message = refused(lambda: client.get("totals", ["a", "b"]), "KEYEDSTATE_SERVICE_BAD_REQUEST")
    assert "not a string" in message
    message = refused(
        lambda: client.lookup("totals", ["a"], min_batch=10**6, timeout=0.3),
        "KEYEDSTATE_SERVICE_BATCH_NOT_REACHED",
    )
    assert "did not commit batch 1000000" in message and "last committed batch is" in message
    refused(
        lambda: client._request("POST", "/v1/state/totals", {"keys": []}),
        "KEYEDSTATE_SERVICE_BAD_REQUEST",
    )
    refused(lambda: client._request("POST", "/v1/state/totals", {"keys": ["a"], "min_batch": -1}),
            "KEYEDSTATE_SERVICE_BAD_REQUEST")  # fmt: skip
    refused(lambda: client._request("GET", "/v1/state/totals"), "KEYEDSTATE_SERVICE_BAD_REQUEST")
    message = refused(
        lambda: client.get("totals", "a", map_key="x"), "KEYEDSTATE_SERVICE_BAD_REQUEST"
    )
    assert "map_key" in message and "value state" in message
    message = refused(lambda: client.get("tags", "a", map_key=5), "KEYEDSTATE_SERVICE_BAD_REQUEST")
    assert "map_key is 5, not a string" in message
    wrong = QueryableStateClient(client.url, "not-the-token")
    refused(lambda: wrong.get("totals", "a"), "KEYEDSTATE_SERVICE_UNAUTHORIZED")
    assert client.get("totals", KEYS[0]) is not None  # still serving


def test_a_batch_whose_stores_committed_but_that_failed_is_never_seen(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Batch 1's stores commit when its sink computes it; the sink then waits, and fails: every
    lookup meanwhile answers batch 0's state, and after the restart the batch's re-run."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add(_rows(0))
    computed, release = threading.Event(), threading.Event()

    def sink(frame: DataFrame, batch_id: int) -> None:
        frame.collect()  # the keyed function runs: its stores commit this batch
        if batch_id == 1:
            computed.set()
            release.wait(60)
            raise RuntimeError("the sink fails batch 1")

    checkpoint = tmp_path / "checkpoint"
    query = _start(spark, source, checkpoint, sink)
    try:
        _await_batch(checkpoint, query, 0)
        client = _client(checkpoint, query)
        before = client.lookup("totals", KEYS)
        assert before.batch == 0
        source.add(_rows(1))
        assert computed.wait(60), query.exception()
        for _ in range(20):  # the stores hold batch 1, the commit log does not
            during = client.lookup("totals", KEYS)
            assert (during.batch, during.values) == (0, before.values)
            time.sleep(0.02)
    finally:
        release.set()
    with pytest.raises(Exception, match="the sink fails batch 1"):
        query.awaitTermination(60)
    assert committed_batches(checkpoint) == [0]

    query = _start(spark, source, checkpoint)
    try:
        _await_batch(checkpoint, query, 1)
        client = _client(checkpoint, query)
        after = client.lookup("totals", KEYS, min_batch=1)
        assert after.values == [
            _state_at(spark, checkpoint, "total", after.batch).get(k) for k in KEYS
        ]
        assert after.values != before.values
    finally:
        query.stop()


DAILY = T.StructType(
    [
        T.StructField("k", T.StringType()),
        T.StructField("day", T.DateType()),
        T.StructField("bucket", T.IntegerType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("price", T.DecimalType(38, 18)),
    ]
)


def test_keys_of_several_typed_columns_and_struct_values(
    spark: SparkSession, tmp_path: Path
) -> None:
    from tests.support.keyed_functions import QueryableDaily

    def utc(*parts: int) -> dt.datetime:
        return dt.datetime(*parts, tzinfo=dt.timezone.utc)  # type: ignore[misc]

    day = dt.date(2026, 11, 28)
    # (k, day, bucket, at, price): written as JSON lines, read back as the client decodes them
    # (timestamps in local time, as pyspark's collect()).
    given = [
        ("a", day, 1, utc(2026, 11, 28, 10, 0, 1, 250000), decimal.Decimal("12.5")),
        ("a", day, 2, utc(2026, 11, 28, 11, 0), decimal.Decimal("-0.25")),
        ("b", day + dt.timedelta(days=1), 1, utc(2026, 11, 29, 0, 0), decimal.Decimal("7")),
    ]
    rows = [
        {"k": k, "day": d.isoformat(), "bucket": b, "at": at.isoformat(), "price": float(p)}
        for k, d, b, at, p in given
    ]
    source = FileInput(tmp_path / "input", DAILY)
    source.add(rows)
    frame = key_by(source.read_stream(spark), "k", "day", "bucket").process(
        QueryableDaily(), "k string, price decimal(38,18)", uid="daily"
    )
    checkpoint = tmp_path / "checkpoint"
    query = _run(spark, frame, checkpoint)
    try:
        _await_batch(checkpoint, query, 0)
        client = _client(checkpoint, query)
        keys = [(k, d, b) for k, d, b, _, _ in given] + [("a", day, 3)]
        values = client.get_many("daily", keys)
        local = [at.astimezone().replace(tzinfo=None) for _, _, _, at, _ in given]
        assert values == [
            Row(at=at, price=p.quantize(decimal.Decimal(10) ** -18))
            for at, (_, _, _, _, p) in zip(local, given, strict=True)
        ] + [None]
        # The same through plain JSON: a key is an array of its columns' values.
        answer = client._request("POST", "/v1/state/daily", {"keys": [["b", "2026-11-29", 1]]})
        assert answer["values"] == [{"at": "2026-11-29T00:00:00Z", "price": "7.000000000000000000"}]

        def refused(key: Any, *needles: str) -> None:  # noqa: ANN401
            with pytest.raises(QueryServiceError) as caught:
                client._request("POST", "/v1/state/daily", {"keys": [key]})
            assert caught.value.error_id == "KEYEDSTATE_SERVICE_BAD_REQUEST", str(caught.value)
            for needle in needles:
                assert needle in str(caught.value), str(caught.value)

        refused(["a", "2026-11-28"], "has 2 values", "3 fields", "(k string, day date, bucket int)")
        refused(["a", "28.11.2026", 1], "key #0.day", "YYYY-MM-DD")
        refused(["a", "2026-11-28", 2**40], "key #0.bucket", "range of int")
        refused("a", "not an array of 3 key column values")
        refused(None, "not an array of 3 key column values")
    finally:
        query.stop()


def test_set_queryable_is_checked_where_it_is_called(spark: SparkSession, tmp_path: Path) -> None:
    from keyedstate import (
        ListStateDescriptor,
        MapStateDescriptor,
        StateUsageError,
        ValueStateDescriptor,
    )

    total = ValueStateDescriptor("total", Types.LONG())
    for bad in ("", " x", "a/b", 7):
        with pytest.raises(StateUsageError, match="queryable state name"):
            total.set_queryable(bad)  # type: ignore[arg-type]
    total.set_queryable("totals")
    assert total.get_queryable_state_name() == "totals" and total.is_queryable()
    with pytest.raises(StateUsageError, match="queryable as 'totals' already"):
        total.set_queryable("again")
    # Broadcast state is kept per partition, not by key: refused when the query is planned.
    rules = MapStateDescriptor("rules", Types.STRING(), Types.LONG())
    rules.set_queryable("rules")
    events = FileInput(tmp_path / "events", SCHEMA).read_stream(spark)
    updates = FileInput(tmp_path / "rules", SCHEMA).read_stream(spark)
    from tests.support.keyed_functions import RuleMatches

    with pytest.raises(StateUsageError, match="broadcast state, which is not queryable"):
        key_by(events, "k").connect(keyedstate.broadcast(updates, rules)).process(
            RuleMatches(), "k string, v long"
        )
    assert ListStateDescriptor("l", Types.LONG()).get_queryable_state_name() is None


def test_a_restarted_query_is_served_from_the_version_its_first_batch_loads(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A new run's first batch publishes the version it loads before it writes: while that batch
    runs (held in the function), lookups answer the last batch of the run before."""
    source, checkpoint = _ran(spark, tmp_path, 1)
    pause = tmp_path / "pause"
    query = _start(spark, source, checkpoint, function=QueryableTotals(pause_file=str(pause)))
    try:
        source.add([*_rows(1), {"k": KEYS[0], "v": 1, "tag": "pause"}])
        deadline = time.monotonic() + 120
        while not Path(str(pause) + ".reached").exists():
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.05)
        client = _client(checkpoint, query)
        before = _state_at(spark, checkpoint, "total", 0)
        during = client.lookup("totals", KEYS)
        assert (during.batch, during.values) == (0, [before.get(k) for k in KEYS])
        pause.touch()
        _await_batch(checkpoint, query, 1)
        after = client.lookup("totals", KEYS, min_batch=1)
        assert after.values == [_state_at(spark, checkpoint, "total", 1).get(k) for k in KEYS]
        assert after.values != during.values
    finally:
        pause.touch()
        query.stop()


def test_the_state_of_spark_s_aggregation_is_queryable(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source = FileInput(tmp_path / "input", SCHEMA)
    source.add(_rows(0))
    totals = source.read_stream(spark).groupBy("k").agg(F.sum("v").alias("total"), F.count("v"))
    key = "spark.sql.streaming.stateStore.keyedstate.queryable.operator.0"
    checkpoint = tmp_path / "checkpoint"
    try:
        frame = keyedstate.queryable(totals, operator=0, name="sums")
        query = _run(spark, frame, checkpoint, mode="update")
    finally:
        spark.conf.unset(key)  # the setting is the session's: the query took it at its start
    try:
        _await_batch(checkpoint, query, 0)
        source.add(_rows(1))
        _await_batch(checkpoint, query, 1)
        client = _client(checkpoint, query)
        answer = client.lookup("sums", [*KEYS, "nobody"], min_batch=1)
        stored = keyedstate.state.read(spark, str(checkpoint), 0, batch_id=answer.batch).collect()
        expected = {row["key"]["k"]: row["value"].asDict() for row in stored}
        assert expected
        assert [None if v is None else v.asDict() for v in answer.values] == [
            expected.get(k) for k in [*KEYS, "nobody"]
        ]
        [info] = [s for s in client.states() if s.name == "sums"]
        assert info.kind == "store" and info.key_columns == (("k", "string"),)
        with pytest.raises(ValueError, match="operator id"):
            keyedstate.queryable(totals, operator=-1, name="x")
    finally:
        query.stop()


def test_expired_elements_of_a_ttl_state_are_hidden_as_at_the_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    from tests.support.keyed_functions import QueryableRecent

    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"k": "old", "v": 1, "tag": "x"}, {"k": "both", "v": 2, "tag": "x"}])
    checkpoint = tmp_path / "checkpoint"
    query = _start(spark, source, checkpoint, function=QueryableRecent(ttl_s=2))
    try:
        _await_batch(checkpoint, query, 0)
        client = _client(checkpoint, query)
        assert client.get_many("recent", ["old", "both"], min_batch=0) == [[1], [2]]
        time.sleep(2.5)  # batch 1's processing time is past the elements of batch 0
        source.add([{"k": "both", "v": 3, "tag": "x"}, {"k": "new", "v": 4, "tag": "x"}])
        _await_batch(checkpoint, query, 1)
        answer = client.lookup("recent", ["old", "both", "new"], min_batch=1)
        assert answer.batch == 1 and answer.values == [None, [3], [4]]
        stored = _state_at(spark, checkpoint, "recent", 1)  # the reader hides them alike
        assert answer.values == [stored.get(k) for k in ["old", "both", "new"]]
    finally:
        query.stop()


def test_a_rescaled_query_routes_keys_by_its_new_partition_count(
    spark: SparkSession, tmp_path: Path
) -> None:
    """2 partitions -> keyedstate.rescale to 3 -> restarted: lookups route each key by the new
    count (pmod(hash, 3)) and equal the reader, before and after the rescaled query's batches."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add(_rows(0))
    checkpoint, rescaled = tmp_path / "checkpoint", tmp_path / "rescaled"
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")  # a new checkpoint pins the session's count
    try:
        query = _start(spark, source, checkpoint)
        try:
            _await_batch(checkpoint, query, 0)
            client = _client(checkpoint, query)
            [info] = [
                s for s in client.states() if s.query_id == client.query_id and s.name == "totals"
            ]
            assert info.partitions == 2
        finally:
            query.stop()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    keyedstate.rescale(spark, str(checkpoint), 3, output=str(rescaled))
    query = _start(spark, source, rescaled)
    try:
        source.add(_rows(1))
        _await_batch(rescaled, query, 1)
        client = _client(rescaled, query)
        [info] = [
            s for s in client.states() if s.query_id == client.query_id and s.name == "totals"
        ]
        assert info.partitions == 3
        answer = client.lookup("totals", KEYS, min_batch=1)
        assert answer.values == [
            _state_at(spark, rescaled, "total", answer.batch).get(k) for k in KEYS
        ]
        assert all(v is not None for v in answer.values)
    finally:
        query.stop()


def test_a_bounded_load_of_lookups_while_batches_commit(
    running: Running, spark: SparkSession
) -> None:
    """Four threads, 150 lookups each, while two more batches commit: no lookup fails, and each
    answer is exactly the reader's state at the batch it names."""
    from concurrent.futures import ThreadPoolExecutor

    start = max(committed_batches(running.checkpoint))

    def lookups(seed: int) -> list[tuple[int, list[Any]]]:
        client = QueryableStateClient(running.client.url, running.client.token)
        out = []
        for i in range(150):
            keys = [KEYS[(seed * 7 + i + j) % len(KEYS)] for j in range(3)]
            answer = client.lookup("totals", keys, query_id=str(running.query.id))
            out.append((answer.batch, list(zip(keys, answer.values, strict=True))))
        return out

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(lookups, seed) for seed in range(4)]
        for batch in (start + 1, start + 2):
            running.source.add(_rows(batch))
            _await_batch(running.checkpoint, running.query, batch)
        answers = [a for f in futures for a in f.result()]
    assert len(answers) == 600
    seen = {batch for batch, _ in answers}
    assert seen <= set(range(start, start + 3)), seen
    expected = {b: _state_at(spark, running.checkpoint, "total", b) for b in seen}
    for batch, pairs in answers:
        assert all(value == expected[batch].get(key) for key, value in pairs), (batch, pairs)


def test_a_deduplication_s_keys_are_queryable(spark: SparkSession, tmp_path: Path) -> None:
    """dropDuplicates made queryable: a key it has seen answers its stored row, another None."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add(_rows(0))
    unique = source.read_stream(spark).dropDuplicates(["k"])
    key = "spark.sql.streaming.stateStore.keyedstate.queryable.operator.0"
    checkpoint = tmp_path / "checkpoint"
    try:
        query = _run(spark, keyedstate.queryable(unique, operator=0, name="seen"), checkpoint)
    finally:
        spark.conf.unset(key)
    try:
        _await_batch(checkpoint, query, 0)
        client = _client(checkpoint, query)
        seen = {row["k"] for row in _rows(0)}
        answer = client.lookup("seen", [*KEYS, "nobody"], min_batch=0)
        assert [v is not None for v in answer.values] == [k in seen for k in [*KEYS, "nobody"]]
        assert len(seen) < len(KEYS)  # some keys are unseen
    finally:
        query.stop()


def test_an_apply_in_pandas_with_state_s_state_is_queryable(
    spark: SparkSession, tmp_path: Path
) -> None:
    """applyInPandasWithState (Spark's flatMapGroupsWithState for Python) made queryable: each
    group's stored state row, as the reader shows it."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def running_count(key: tuple, pdfs: Any, state: Any) -> Any:  # noqa: ANN401
        cnt, total = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            cnt, total = cnt + len(pdf), total + int(pdf["v"].sum())
        state.update((cnt, total))
        yield pd.DataFrame({"k": [key[0]], "cnt": [cnt], "total": [total]})

    source = FileInput(tmp_path / "input", SCHEMA)
    source.add(_rows(0))
    counts = (
        source.read_stream(spark)
        .groupBy("k")
        .applyInPandasWithState(
            running_count,
            outputStructType="k string, cnt long, total long",
            stateStructType="cnt long, total long",
            outputMode="update",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    )
    key = "spark.sql.streaming.stateStore.keyedstate.queryable.operator.0"
    checkpoint = tmp_path / "checkpoint"
    try:
        query = _run(
            spark,
            keyedstate.queryable(counts, operator=0, name="groups"),
            checkpoint,
            mode="update",
        )
    finally:
        spark.conf.unset(key)
    try:
        _await_batch(checkpoint, query, 0)
        client = _client(checkpoint, query)
        answer = client.lookup("groups", [*KEYS, "nobody"], min_batch=0)
        stored = keyedstate.state.read(spark, str(checkpoint), 0, batch_id=answer.batch).collect()
        expected = {row["key"]["k"]: row["value"].asDict(recursive=True) for row in stored}
        assert expected
        assert [None if v is None else v.asDict(recursive=True) for v in answer.values] == [
            expected.get(k) for k in [*KEYS, "nobody"]
        ]
    finally:
        query.stop()


def test_a_stopped_query_stays_queryable_from_its_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Once its query stops, the application keeps serving its state: read from the checkpoint
    at the last committed batch, every kind equal to the state reader's; after another run, the
    copy read follows the new batch by its changelog."""
    source, checkpoint = _ran(spark, tmp_path, 2)
    deadline = time.monotonic() + 30
    client = QueryableStateClient.for_checkpoint(str(checkpoint))
    while not any(s.name == "totals" and not s.running for s in client.states()):
        assert time.monotonic() < deadline, "the service never marked the query stopped"
        time.sleep(0.05)
    answer = client.lookup("totals", [*KEYS, "nobody"])
    assert answer.batch == 1 and answer.behind == []
    totals = _state_at(spark, checkpoint, "total", 1)
    assert answer.values == [totals.get(k) for k in [*KEYS, "nobody"]]
    assert all(v is not None for v in answer.values[:-1])
    amounts = _state_at(spark, checkpoint, "amounts", 1)
    assert client.get_many("amounts", KEYS) == [amounts.get(k) for k in KEYS]
    tags = _state_at(spark, checkpoint, "tags", 1)
    assert client.get_many("tags", KEYS) == [tags.get(k) for k in KEYS]
    assert client.get_many("tags", KEYS, map_key="t1") == [
        (tags.get(k) or {}).get("t1") for k in KEYS
    ]
    with pytest.raises(QueryServiceError) as refused:
        client.lookup("totals", KEYS, min_batch=2)
    assert refused.value.error_id == "KEYEDSTATE_SERVICE_BATCH_NOT_REACHED"

    _run_batch(spark, source, checkpoint, 2)
    client = QueryableStateClient.for_checkpoint(str(checkpoint))
    after = client.lookup("totals", KEYS, min_batch=2)
    assert after.values == [_state_at(spark, checkpoint, "total", 2).get(k) for k in KEYS]
    assert after.values != answer.values[:-1]


def test_a_damaged_changelog_is_reported_and_the_last_good_batch_served(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A stopped query's state read from the checkpoint: when the changelog of its newest
    version is damaged, lookups keep answering the version before, say which partition is
    behind and why (the file's path), and a lookup that needs the newer batch is refused."""
    from keyedstate.service import StaleStateWarning

    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # every key in the damaged partition
    try:
        source, checkpoint = _ran(spark, tmp_path, 1)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    client = QueryableStateClient.for_checkpoint(str(checkpoint))
    good = client.lookup("totals", KEYS)  # the checkpoint's version 1 is loaded
    assert good.batch == 0 and good.values == [
        _state_at(spark, checkpoint, "total", 0).get(k) for k in KEYS
    ]
    _run_batch(spark, source, checkpoint, 1)
    [damaged] = checkpoint.glob("state/*/0/changelog/2-*.changelog")
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    client = QueryableStateClient.for_checkpoint(str(checkpoint))
    for _ in range(2):  # reported at each lookup, and served all the same
        with pytest.warns(StaleStateWarning, match=damaged.name):
            answer = client.lookup("totals", KEYS)
        assert answer.batch == 1 and answer.values == good.values
        [behind] = answer.behind
        assert (behind.partition, behind.batch) == (0, 0)
        assert str(damaged) in behind.reason or damaged.name in behind.reason
    with pytest.raises(QueryServiceError, match=damaged.name) as refused:
        client.lookup("totals", KEYS, min_batch=1)
    assert refused.value.error_id == "KEYEDSTATE_SERVICE_STATE_UNAVAILABLE"


def test_parts_of_maps_by_map_key_and_of_lists_by_index(running: Running) -> None:
    """A range or a prefix of each key's map entries (in map-key order) and a slice of each
    key's list, equal to the same part of the whole map or list read at the same batch."""
    client = running.client
    keys = KEYS[:4]
    # Every key gets the three tags and three more amounts, in a batch of its own.
    batch = max(committed_batches(running.checkpoint)) + 1
    running.source.add([{"k": k, "v": j, "tag": f"t{j}"} for k in keys for j in range(3)])
    _await_batch(running.checkpoint, running.query, batch)
    tags = client.lookup("tags", keys, min_batch=batch)
    amounts = client.lookup("amounts", keys, min_batch=tags.batch)
    assert all(tags.values) and all(amounts.values)

    def read(**options: Any) -> list[Any]:  # noqa: ANN401
        answer = client.lookup("tags", keys, **options)
        assert answer.batch == tags.batch, "a batch committed meanwhile: the fixture runs none"
        return [None if v is None else list(v.items()) for v in answer.values]

    def expected(lo: str | None = None, hi: str | None = None, prefix: str = "") -> list[Any]:
        """The part of each key's map, [] when none of it is in range (None: no map)."""
        return [
            None
            if t is None
            else sorted(
                (m, v)
                for m, v in t.items()
                if (lo is None or m >= lo) and (hi is None or m < hi) and m.startswith(prefix)
            )
            for t in tags.values
        ]

    assert read(map_key_from="t1") == expected(lo="t1")
    assert read(map_key_to="t1") == expected(hi="t1")
    assert read(map_key_from="t0", map_key_to="t2") == expected(lo="t0", hi="t2")
    assert read(map_key_prefix="t2") == expected(prefix="t2")
    assert read(map_key_prefix="x") == [[]] * len(keys)
    assert read(map_key_from="t0", limit=3) == expected(lo="t0")
    with pytest.raises(QueryServiceError, match="more than limit=1"):
        client.lookup("tags", keys, map_key_from="t0", limit=1)

    def sliced(start: int | None, stop: int | None) -> list[Any]:
        return client.lookup("amounts", keys, start=start, stop=stop).values

    for start, stop in [(0, 1), (-2, None), (1, 3), (None, -1), (5, 2)]:
        assert sliced(start, stop) == [a[start:stop] for a in amounts.values], (start, stop)

    for bad, match in [
        ({"map_key_prefix": "t"}, "string keys"),
        ({"map_key_from": 1}, "map state"),
    ]:
        with pytest.raises(QueryServiceError, match=match) as refused:
            client.lookup("amounts", keys, **bad)
        assert refused.value.error_id == "KEYEDSTATE_SERVICE_BAD_REQUEST"
    with pytest.raises(QueryServiceError, match="list state") as refused:
        client.lookup("tags", keys, start=1)
    assert refused.value.error_id == "KEYEDSTATE_SERVICE_BAD_REQUEST"
    with pytest.raises(QueryServiceError, match="not both"):
        client.lookup("tags", keys, start=1, map_key_prefix="t")
    with pytest.raises(QueryServiceError, match="one entry"):
        client.lookup("tags", keys, map_key="t1", map_key_from="t0")
