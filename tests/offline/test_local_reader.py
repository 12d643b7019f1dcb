"""The local reader (``keyedstate.offline.local_reader``): one state partition of a checkpoint or a
native savepoint read without Spark, with rocksdict, equals what ``keyedstate.state.read`` (the
reader in Spark, the oracle) reads of that partition: a Spark aggregation (LZ4 changelogs) and
keyed functions with value, list (appended: merge operands in the snapshot's files), map,
operator list state and timers, over every stored type, at versions built from a snapshot and
changelogs, from changelogs alone (before the first snapshot), and in native savepoints, read on
a copy. Damaged and missing files are named; rocksdict bundles the RocksDB of pyspark's
rocksdbjni."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import pickle
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import keyedstate
import pyspark
import pytest
from keyedstate import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    key_by,
)
from keyedstate.errors import CheckpointError
from keyedstate.offline.local_reader import (
    INSTALL_HINT,
    LocalPartition,
    open_partition,
    rocksdict_rocksdb_version,
)
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from tests.offline.test_savepoints import PHASES, Line, counts, tally
from tests.support.keyed_functions import CountsProcessed
from tests.support.state_api_support import ship_by_value
from tests.support.streaming_harness import map_leaves, session_conf

SNAPSHOT_EVERY = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
CODEC = "spark.sql.streaming.stateStore.keyedstate.changelogCompression"

RICH = Types.ROW_NAMED(
    ["flag", "tiny", "small", "n", "f", "d", "money", "big", "day", "at", "s", "raw", "xs", "m",
     "inner"],
    [
        Types.BOOLEAN(), Types.BYTE(), Types.SHORT(), Types.INT(), Types.FLOAT(), Types.DOUBLE(),
        Types.BIG_DEC(10, 2), Types.BIG_DEC(38, 18), Types.SQL_DATE(), Types.SQL_TIMESTAMP(),
        Types.STRING(), Types.BYTES(), Types.LIST(Types.LONG()),
        Types.MAP(Types.STRING(), Types.DOUBLE()),
        Types.ROW_NAMED(["a", "b"], [Types.INT(), Types.STRING()]),
    ],
)


class Rich(KeyedProcessFunction, CountsProcessed):
    """Per key (two key columns): a value of every stored type, an appended list (merged in
    RocksDB), a map to pickled objects and processing-time timers that never fire; per
    partition (operator state): how many elements it processed."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.rich = runtime_context.get_state(ValueStateDescriptor("rich", RICH))
        self.seen = runtime_context.get_list_state(ListStateDescriptor("seen", Types.STRING()))
        self.blobs = runtime_context.get_map_state(
            MapStateDescriptor("blobs", Types.INT(), Types.PICKLED_BYTE_ARRAY())
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        v = value.v
        self.processed += 1
        self.seen.add(f"{value.k}-{v}")
        self.blobs.put(v % 4, {"v": v, "t": (v, str(v))})
        self.rich.update(
            {
                "flag": v % 2 == 0,
                "tiny": v % 100 - 50,
                "small": -v * 7,
                "n": v * 1000,
                "f": v / 3,
                "d": -v / 7,
                "money": decimal.Decimal(v) / 4,
                "big": decimal.Decimal(f"-{v}.{v:018d}") if v % 5 else None,
                "day": dt.date(2024, 1, 1) + dt.timedelta(days=v),
                "at": dt.datetime(2024, 1, 1, 12, 0, v % 60, tzinfo=dt.timezone.utc),
                "s": "é" * (v % 5),
                "raw": bytes([v % 256]) * (v % 3),
                "xs": [v, None, -v] if v % 3 else [],
                "m": {"a": v / 2, "n": None},
                "inner": (v, None if v % 2 else "x"),
            }
        )
        ctx.timer_service().register_processing_time_timer(4_000_000_000_000 + v)
        yield (value.k, value.g, v)


ship_by_value(__name__)


def rich(frame: DataFrame) -> DataFrame:
    keyed = key_by(frame.withColumn("g", (F.col("v") % 3).cast("int")), "k", "g")
    return keyed.process(Rich(), "k string, g int, v long", uid="rich", timer_mode="processing")


@dataclass(frozen=True)
class Stored:
    checkpoint: Path
    savepoint: Path
    operator: int


# name: (query, output mode, changelog codec, stateful operator id)
LINES: dict[str, tuple[Callable[[DataFrame], DataFrame], str, str, int]] = {
    "counts": (counts, "update", "lz4", 0),
    "tally": (tally, "append", "zstd", 1000),
    "rich": (rich, "append", "zstd", 1000),
}


@pytest.fixture(scope="module")
def stored(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Stored]:
    """Each query run over PHASES (6 batches) with a snapshot every 2 versions, so its last
    version is a snapshot and changelogs; then a native savepoint of it."""
    root = tmp_path_factory.mktemp("local-reader")
    out = {}
    with session_conf(spark, {SNAPSHOT_EVERY: "2"}):
        for name, (build, mode, codec, operator) in LINES.items():
            with session_conf(spark, {CODEC: codec}):
                line = Line(spark, root / name, build, mode)
                checkpoint = root / name / "checkpoint"
                for phase in PHASES:
                    line.run(checkpoint, phase)
                savepoint = root / name / "savepoint"
                keyedstate.savepoint(spark, str(checkpoint), str(savepoint))
            out[name] = Stored(checkpoint, savepoint, operator)
    return out


# ---- comparing ----


def plain(value: Any) -> Any:  # noqa: ANN401 - any decoded or collected value
    """Collected and locally decoded values alike: rows as dicts, binary as bytes, timestamps
    in UTC (pyspark collects naive local time, the local reader gives UTC)."""
    return map_leaves(value, _plain_leaf)


def _plain_leaf(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc)
    return value


def partitions(location: Path, operator: int) -> list[int]:
    return sorted(int(p.name) for p in (location / "state" / str(operator)).iterdir()
                  if p.name.isdigit())


def spark_rows(
    spark: SparkSession, location: Path, operator: int, state: str, version: int | None
) -> dict[int, list[Row]]:
    """``keyedstate.state.read`` of one table at a state version (batch id + 1), by partition
    (lists and maps unflattened)."""
    batch = None if version is None else version - 1
    frame = keyedstate.state.read(
        spark, str(location), operator, state, batch_id=batch, flatten=False
    )
    out: dict[int, list[Row]] = {p: [] for p in partitions(location, operator)}
    for row in frame.collect():
        out[row.partition_id].append(row)
    return out


def spark_state(row: Row, state: str) -> tuple[Any, Any]:
    """(key as ``LocalPartition.state`` gives it, value) of a keyed function's row."""
    fields = row.asDict(recursive=False)
    fields.pop("partition_id")
    if state.startswith("$"):  # timers: (timestamp, key)
        timestamp = fields.pop("timestamp")
        key = tuple(fields.values())
        return timestamp, key[0] if len(key) == 1 else key
    value = fields.pop("value")
    key = tuple(fields.values())
    return (key[0] if len(key) == 1 else key), plain(value)


def expected_state(rows: list[Row], state: str, kind: str) -> Any:  # noqa: ANN401
    pairs = [spark_state(r, state) for r in rows]
    if state.startswith("$"):
        return sorted(pairs)
    if kind == "operator_list":
        return pairs[0][1] if pairs else []
    return dict(pairs)


def local_state(part: LocalPartition, state: str) -> Any:  # noqa: ANN401
    found = part.state(state)
    if state.startswith("$"):
        return sorted(found)
    if isinstance(found, list):
        return plain(found)
    return {key: plain(value) for key, value in found.items()}


def listing(location: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(location)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in location.rglob("*")
        if p.is_file()
    }


def opened(
    location: Path, operator: int | str, partition: int, **kwargs: Any  # noqa: ANN401
) -> LocalPartition:
    """``open_partition``, failing on any warning (a RocksDB version mismatch warns)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return open_partition(location, operator, partition, **kwargs)


def changelog_codecs(location: Path, operator: int, part: LocalPartition) -> set[int]:
    """The codec ids in the headers of the changelogs ``part`` replayed."""
    directory = location / "state" / str(operator) / str(part.partition)
    return {
        (directory / log["file"]["path"]).read_bytes()[5] for log in part.manifest["changelogs"]
    }


# ---- the tests ----


@pytest.mark.parametrize("where", ["checkpoint", "savepoint"])
def test_an_aggregation_reads_as_the_spark_reader_reads_it(
    spark: SparkSession, stored: dict[str, Stored], where: str, tmp_path: Path
) -> None:
    location = getattr(stored["counts"], where)
    want = {
        p: {tuple(r.key): plain(r.value) for r in rows}
        for p, rows in spark_rows(spark, location, 0, "default", None).items()
    }
    before = listing(location)
    got, built, codecs = {}, [], set()
    for p in partitions(location, 0):
        with opened(location, 0, p, work_dir=tmp_path) as part:
            assert part.declaration is None and "default" in part.column_families()
            got[p] = {key: plain(value) for key, value in part.items("default")}
            built.append((part.snapshot_version, part.changelog_versions))
            codecs |= changelog_codecs(location, 0, part)
    assert got == want and any(want.values())
    # Built from a snapshot and LZ4 changelogs (lz4-java's block framing), on a copy: nothing
    # was written where the state is stored, and the copy is gone.
    assert any(snapshot > 0 and logs for snapshot, logs in built), built
    assert codecs == {1}, codecs
    assert listing(location) == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("where", "version"),
    [("checkpoint", None), ("savepoint", None), ("checkpoint", 2), ("checkpoint", 3)],
    ids=["checkpoint", "savepoint", "checkpoint-version-2", "checkpoint-version-3"],
)
def test_a_keyed_functions_value_list_and_map_state_read_as_the_spark_reader_reads_them(
    spark: SparkSession, stored: dict[str, Stored], where: str, version: int | None
) -> None:
    location = getattr(stored["tally"], where)
    built = []
    for state, kind in [("count", "value"), ("recent", "list"), ("parity", "map")]:
        want = {
            p: expected_state(rows, state, kind)
            for p, rows in spark_rows(spark, location, 1000, state, version).items()
        }
        got = {}
        for p in partitions(location, 1000):
            # The operator by its uid or by its id.
            with opened(location, "tally" if p else 1000, p, version=version) as part:
                assert part.declaration["uid"] == "tally"
                if version is not None:
                    assert part.version == version
                got[p] = local_state(part, state)
                built.append((part.snapshot_version, part.changelog_versions))
        assert got == want and any(want.values()), state
    if version == 2:  # before the first snapshot: changelogs replayed on an empty database
        assert all(snapshot == 0 and logs == [1, 2] for snapshot, logs in built), built
    elif version is None:
        assert any(snapshot > 0 and logs for snapshot, logs in built), built


@pytest.mark.parametrize("where", ["checkpoint", "savepoint"])
def test_every_stored_type_appended_lists_operator_state_and_timers_read_as_spark_reads_them(
    spark: SparkSession, stored: dict[str, Stored], where: str
) -> None:
    location = getattr(stored["rich"], where)
    states = [
        ("rich", "value"),
        ("seen", "list"),
        ("blobs", "map"),
        ("processed", "operator_list"),
        ("$procTimers", "timers"),
    ]
    parts = {p: opened(location, 1000, p) for p in partitions(location, 1000)}
    try:
        for state, kind in states:
            want = {
                p: expected_state(rows, state, kind)
                for p, rows in spark_rows(spark, location, 1000, state, None).items()
            }
            got = {p: local_state(part, state) for p, part in parts.items()}
            assert got == want and any(want.values()), state
        # Every decoded value is what the function stored, pickled objects included.
        for part in parts.values():
            for (k, g), blobs in part.state("blobs").items():
                assert all(pickle.loads(b)["v"] % 4 == m for m, b in blobs.items()), (k, g)
        assert any(p.snapshot_version > 0 and p.changelog_versions for p in parts.values())
        # The same RocksDB wrote the snapshot (its OPTIONS file) as rocksdict reads it with.
        assert {p.rocksdb_version for p in parts.values()} == {rocksdict_rocksdb_version()}
    finally:
        for part in parts.values():
            part.close()


def copy_of(location: Path, target: Path) -> Path:
    shutil.copytree(location, target)
    return target


def manifest_of(location: Path, operator: int, partition: int) -> tuple[Path, dict[str, Any]]:
    directory = location / "state" / str(operator) / str(partition)
    with open_partition(location, operator, partition) as part:
        version = part.version
    path = directory / f"{version}.manifest"
    return path, json.loads(path.read_text())


def test_a_damaged_or_missing_file_is_named_with_its_version(
    stored: dict[str, Stored], tmp_path: Path
) -> None:
    # A damaged snapshot file of a savepoint.
    savepoint = copy_of(stored["tally"].savepoint, tmp_path / "savepoint")
    path, manifest = manifest_of(savepoint, 1000, 0)
    directory = path.parent
    ssts = [f for f in manifest["files"] if f["localName"].endswith(".sst")]
    assert ssts and manifest["changelogs"], manifest
    damaged = directory / ssts[0]["path"]
    original = damaged.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as failure:
        open_partition(savepoint, 1000, 0)
    error = failure.value
    assert error.error_id == "KEYEDSTATE_CHECKPOINT_FILE_CORRUPT"
    assert str(damaged) in str(error) and f"version {manifest['version']}" in str(error)

    # A missing changelog.
    damaged.write_bytes(original)
    missing = directory / manifest["changelogs"][-1]["file"]["path"]
    missing.unlink()
    with pytest.raises(CheckpointError) as failure:
        open_partition(savepoint, 1000, 0)
    error = failure.value
    assert error.error_id == "KEYEDSTATE_CHECKPOINT_FILE_MISSING"
    assert str(missing) in str(error) and f"version {manifest['version']}" in str(error)

    # A truncated changelog whose manifest entry matches it (a writer's bug, not a copy's): its
    # replay fails naming it and its own version, nothing applied in part.
    checkpoint = copy_of(stored["tally"].checkpoint, tmp_path / "checkpoint")
    path, manifest = manifest_of(checkpoint, 1000, 0)
    log = manifest["changelogs"][-1]
    truncated = path.parent / log["file"]["path"]
    cut = truncated.read_bytes()[:-6]
    truncated.write_bytes(cut)
    log["file"]["size"], log["file"]["crc32c"] = len(cut), google_crc32c.value(cut)
    path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as failure:
        open_partition(checkpoint, 1000, 0)
    error = failure.value
    assert error.error_id == "KEYEDSTATE_CHECKPOINT_FILE_CORRUPT"
    assert f"State changelog {truncated} of version {log['version']} is damaged" in str(error)


def rocksdbjni_version() -> str:
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    found = [m for j in jars.glob("rocksdbjni-*.jar")
             if (m := re.fullmatch(r"rocksdbjni-(\d+(?:\.\d+)+)\.jar", j.name))]
    assert len(found) == 1, sorted(jars.glob("rocksdbjni*"))
    return found[0].group(1)


def test_rocksdict_bundles_the_rocksdb_of_pysparks_rocksdbjni() -> None:
    """rocksdict reads keyedstate's RocksDB files only as long as it bundles the RocksDB that
    wrote them (pyspark's rocksdbjni): when either moves, pin the other (pyproject.toml)."""
    assert rocksdict_rocksdb_version() == rocksdbjni_version()


def test_without_rocksdict_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rocksdict", None)
    with pytest.raises(ImportError, match=re.escape(INSTALL_HINT)):
        open_partition(tmp_path, 1000, 0)
