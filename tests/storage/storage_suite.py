"""Checkpoints on real remote storage: the tests tests/storage/test_storage_hdfs.py and
tests/storage/test_storage_s3.py run, each with its ``storage`` fixture (an HDFS minicluster or
moto's S3 server, started by the tests, see tests/support/servers/).

Inputs stay local; only the checkpoints live on the remote storage. Per storage:
- a streaming aggregation and a keyedstate Python API query over several micro-batches and a
  restart: output equal to the same query on a local checkpoint, and to plain Python;
- a subset of the operator-equivalence scenarios (tests/provider/test_operator_equivalence.py), the
  provider under test against Spark's RocksDB provider, both checkpointed on the storage;
- a TTL query (tests/provider/test_ttl_queries.py's aggregation case);
- a rescale from and to the storage, then the query continued on the result;
- the kill-and-restart test (tests/provider/test_kill_restart.py) with a few kills.

The full tier (``make test-full``, tests/support/tiers.py) runs every operator-equivalence
scenario and the kill test (both engines; about 6 minutes per storage); CI runs two scenarios
per storage (each module's ``pytest_generate_tests``) and no kill test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.provider.test_kill_restart import run_kill_test
from tests.provider.test_operator_equivalence import (
    AGG_FILES,
    EVENT_SCHEMA,
    SCENARIOS,
    Scenario,
    agg_by_key,
    expected_update_batches,
    split,
)
from tests.support.driver_process import Driver
from tests.support.keyed_functions import CountSum
from tests.support.remote_storage import (
    RemoteStorage,
    apply_hadoop_settings,
    committed_batches,
    driver_env,
    planned_batches,
)
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    REFERENCE_PROVIDER,
    BatchCollector,
    FileInput,
    PhaseRun,
    await_finished,
    diff_batches,
    run_phase,
    start_query,
)
from tests.support.tiers import FULL
from tests.support.ttl_queries import Query, count_by_key, expired_key_starts_fresh


def parametrize_equivalence(metafunc: pytest.Metafunc, subset: set[str]) -> None:
    """A storage module's ``pytest_generate_tests``: the operator-equivalence scenarios it runs,
    ``subset`` in CI and every one in the full tier (``make test-full``). The two storages take
    two of the four store layouts each (one value per key, per window, a join's two stores, column
    families of timeouts): together CI covers the four once."""
    if "scenario" in metafunc.fixturenames:
        chosen = [s for s in SCENARIOS if FULL or s.name in subset]
        metafunc.parametrize("scenario", chosen, ids=str)


KILL_ENGINES = ["aggregation", "python-api"]
KILLS = 3
KILL_FILES = 20

Rows = list[dict[str, Any]]
Batches = dict[int, Rows]


# ---------------------------------------------------------------------------------------------
# Running one query on several checkpoints side by side


@dataclass
class Variant:
    """One run of a query: a provider and a checkpoint location (a local path or a URI)."""

    label: str
    provider: str
    checkpoint: str
    collector: BatchCollector = field(default_factory=BatchCollector)
    last_batch_per_run: list[int] = field(default_factory=list)

    @property
    def batches(self) -> Batches:
        return self.collector.batches


def run_variants(
    spark: SparkSession,
    workdir: Path,
    variants: Sequence[Variant],
    sources: Mapping[str, Any],
    phases: Sequence[Mapping[str, Sequence[Rows]]],
    build: Callable[[Mapping[str, DataFrame]], DataFrame],
    output_mode: str,
) -> None:
    """streaming_harness.run_phases for arbitrary checkpoint locations: each variant has its own
    copy of the inputs; per phase, the files are added and every variant's query runs
    (concurrently) until it has processed them, then stops; the next phase restarts them."""
    inputs = {
        v.label: {n: FileInput(workdir / v.label / n, schema) for n, schema in sources.items()}
        for v in variants
    }
    runs = {
        v.label: PhaseRun(inputs[v.label], v.provider, build, v.checkpoint, v.collector)
        for v in variants
    }
    for phase in phases:
        queries = run_phase(spark, phase, runs, output_mode)
        for v in variants:
            progress = queries[v.label].recentProgress
            v.last_batch_per_run.append(progress[-1].batchId if progress else -1)


def assert_same(expected: Variant, actual: Variant) -> None:
    diff = diff_batches(expected.batches, actual.batches)
    assert not diff, f"{actual.label} differs from {expected.label}:\n{diff}"
    assert actual.batches == expected.batches
    assert any(actual.batches.values()), "no output at all"


@pytest.fixture
def remote(storage: RemoteStorage, spark: SparkSession) -> Iterator[Callable[[str], str]]:
    """``remote(name)``: a fresh checkpoint location on the storage, the session pointed at it."""
    apply_hadoop_settings(spark, storage.hadoop_settings())
    prefix = f"t{time.time_ns()}"
    yield lambda name: storage.uri(f"{prefix}/{name}")


# ---------------------------------------------------------------------------------------------
# (a) The same queries on a local and a remote checkpoint


def count_sum(frames: Mapping[str, DataFrame]) -> DataFrame:
    return keyedstate.key_by(frames["events"].select("key", "v"), "key").process(
        CountSum(), "key string, cnt long, total long"
    )


def test_python_api_same_output_as_on_local_checkpoint(
    spark: SparkSession, remote: Callable[[str], str], tmp_path: Path
) -> None:
    local = Variant("local", PROVIDER_UNDER_TEST, str(tmp_path / "local-checkpoint"))
    on_storage = Variant("remote", PROVIDER_UNDER_TEST, remote("python-api"))
    phases = [{"events": AGG_FILES[:2]}, {"events": AGG_FILES[2:4]}, {"events": AGG_FILES[4:]}]
    run_variants(
        spark, tmp_path, [local, on_storage], {"events": EVENT_SCHEMA}, phases, count_sum, "append"
    )
    assert_same(local, on_storage)
    # Every element's running count and sum, across two restarts.
    seen: dict[str, tuple[int, int]] = {}
    expected = []
    for rows in AGG_FILES:
        for row in rows:
            cnt, total = seen.get(row["key"], (0, 0))
            seen[row["key"]] = (cnt + 1, total + row["v"])
            expected.append({"key": row["key"], "cnt": cnt + 1, "total": total + row["v"]})
    key = lambda r: (r["key"], r["cnt"])  # noqa: E731
    assert sorted(on_storage.collector.all_rows(), key=key) == sorted(expected, key=key)
    assert len(on_storage.last_batch_per_run) == 3


# ---------------------------------------------------------------------------------------------
# (a, e) Operator equivalence: keyedstate with checkpoints on the storage against the reference


def test_operator_same_output_as_reference(
    scenario: Scenario, spark: SparkSession, remote: Callable[[str], str], tmp_path: Path
) -> None:
    # The reference runs on a local checkpoint. (Spark's RocksDB provider also runs on moto
    # with S3Endpoint.hadoop_settings(), which route its uploads around the AWS SDK's transfer
    # manager: bench/storage_bench.py runs it there; this suite does not.)
    reference = Variant("reference", REFERENCE_PROVIDER, str(tmp_path / "reference-checkpoint"))
    under_test = Variant("under-test", PROVIDER_UNDER_TEST, remote(f"{scenario.name}-under-test"))
    variants = [reference, under_test]
    if scenario.name == "agg_update":  # and the same query on a local checkpoint
        variants.append(Variant("local", PROVIDER_UNDER_TEST, str(tmp_path / "local-checkpoint")))
    run_variants(
        spark,
        tmp_path,
        variants,
        scenario.sources,
        scenario.phases,
        scenario.build,
        scenario.output_mode,
    )
    scenario.check(reference.batches)
    for variant in variants[1:]:
        assert_same(reference, variant)
    scenario.check(under_test.batches)
    # The query really restarted: the second run continued the batch ids of the first.
    first, second = under_test.last_batch_per_run
    assert 0 <= first < second


# ---------------------------------------------------------------------------------------------
# (b) TTL


def test_ttl_aggregation(spark: SparkSession, remote: Callable[[str], str], tmp_path: Path) -> None:
    """tests/provider/test_ttl_queries.py's event-time TTL case, checkpointed on the storage."""
    q = Query(spark, tmp_path, count_by_key)
    q.checkpoint = remote("ttl")  # type: ignore[assignment]
    expired_key_starts_fresh(q)


# ---------------------------------------------------------------------------------------------
# (c) Rescale


def test_rescale_then_continue(
    spark: SparkSession, remote: Callable[[str], str], tmp_path: Path
) -> None:
    """2 -> 3 state partitions into a new checkpoint on the storage, then the query continues
    there; the output of both runs is exact."""
    source = FileInput(tmp_path / "events", EVENT_SCHEMA)
    collector = BatchCollector()
    checkpoint, rescaled = remote("rescale-source"), remote("rescale-output")

    def run(location: str, files: Sequence[Rows]) -> None:
        source.add_all(files)
        frames = {"events": source.read_stream(spark)}
        query = start_query(
            spark,
            PROVIDER_UNDER_TEST,
            agg_by_key(frames),
            "update",
            location,
            collector,  # type: ignore[arg-type]
        )
        try:
            await_finished(query)
        finally:
            if query.isActive:
                query.stop()

    phases = split(AGG_FILES, 3)
    partitions = "spark.sql.shuffle.partitions"
    previous = spark.conf.get(partitions)
    spark.conf.set(partitions, "2")  # the source's count (a new checkpoint pins the session's)
    try:
        run(checkpoint, phases[0]["events"])
    finally:
        spark.conf.set(partitions, previous)
    result = keyedstate.rescale(spark, checkpoint, 3, rescaled)
    assert (result.from_partitions, result.to_partitions) == (2, 3), result
    assert result.batch_id == 2 and result.keys > 0, result
    assert result.output.rstrip("/").endswith("rescale-output"), result
    run(rescaled, phases[1]["events"])
    assert collector.batches == expected_update_batches(AGG_FILES)
    report = keyedstate.inspect(spark, rescaled)
    assert report.partitions == 3 and report.batch_id == len(AGG_FILES) - 1, report


@pytest.mark.parametrize("fmt", ["native", "canonical"])
def test_savepoint_moves_to_the_storage_and_back(
    spark: SparkSession, remote: Callable[[str], str], tmp_path: Path, fmt: str
) -> None:
    """A query on a local checkpoint; a savepoint of it (native or canonical) written on the
    storage; restores from there into a new checkpoint on the storage at another partition count
    and into a local one: both continue exactly (a savepoint's paths are relative, its files
    checked on the way)."""
    phases = split(AGG_FILES, 3)
    source = FileInput(tmp_path / "events", EVENT_SCHEMA)
    source.add_all(phases[0]["events"])
    first = BatchCollector()
    frame = agg_by_key({"events": source.read_stream(spark)})
    await_finished(start_query(spark, PROVIDER_UNDER_TEST, frame, "update", tmp_path / "ck", first))
    savepoint = remote(f"savepoint-{fmt}")
    info = keyedstate.savepoint(spark, str(tmp_path / "ck"), savepoint, format=fmt)
    assert info.files > 0 and info.bytes > 0, info
    assert keyedstate.inspect_savepoint(spark, savepoint, verify=True).bytes == info.bytes
    source.add_all(phases[1]["events"])
    seen = len(phases[0]["events"]) + len(phases[1]["events"])
    restores = ((remote(f"restored-{fmt}"), 3), (str(tmp_path / "restored"), None))
    for target, partitions in restores:
        keyedstate.restore_savepoint(spark, savepoint, target, partitions=partitions)
        collector = BatchCollector()
        frame = agg_by_key({"events": source.read_stream(spark)})
        await_finished(start_query(spark, PROVIDER_UNDER_TEST, frame, "update", target, collector))
        batches = {**first.batches, **collector.batches}
        assert batches == expected_update_batches(AGG_FILES[:seen]), target
    keyedstate.dispose_savepoint(spark, savepoint)
    assert keyedstate.list_savepoints(spark, savepoint.rsplit("/", 1)[0]) == []


# ---------------------------------------------------------------------------------------------
# (d) SIGKILLs of the whole driver


@pytest.mark.skipif(
    not FULL, reason="full tier (make test-full): the kill test on remote storage"
)
@pytest.mark.parametrize("engine", KILL_ENGINES)
def test_kill_and_restart_is_exactly_once(
    engine: str, storage: RemoteStorage, tmp_path: Path, drivers: list[Driver]
) -> None:
    checkpoint = storage.uri(f"t{time.time_ns()}/killed")
    run_kill_test(
        engine,
        tmp_path,
        drivers,
        num_kills=KILLS,
        num_files=KILL_FILES,
        checkpoint_uri=checkpoint,
        list_commits=lambda: committed_batches(storage, checkpoint),
        list_offsets=lambda: planned_batches(storage, checkpoint),
        env=driver_env(storage),
        clean_run=False,  # the values computed in Python are the reference
    )
