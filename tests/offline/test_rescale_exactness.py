"""A checkpoint rescaled to another partition count gives exactly the never-rescaled output.

For every operator the provider serves (the scenarios of test_operator_equivalence.py: their
inputs, queries and plain-Python checks), a query runs some batches at N partitions and stops;
its checkpoint is rescaled up and down (``keyedstate.rescale``, to new checkpoints) and in place;
each rescaled checkpoint is restarted with the rest of the input. The per-batch output after the
restart must equal that of a reference that ran the same phases at N partitions and was never
rescaled, the restarted query must run with M state partitions, and the rescaled state must hold
exactly the source's rows, each in the partition Spark's hash partitioning gives its key
(``pmod(hash(key columns), M)``, computed here with Spark SQL's ``hash``).

Also: the source of a default rescale is byte-for-byte untouched and still restarts at N; chained
rescales; the CLI; rescales killed (SIGKILL of the whole driver process group, JVM included) at
chosen phases, after which the source must restart exactly and a re-run must succeed; and the
refusals (another provider's checkpoint, a bad partition count, an uncommitted last batch, a
query running in this application or in another one).

Runtime: the processes these tests start (the rescale drivers, a running query, the CLI) are
started by the ``agg_lines`` fixture before its own runs, so that their JVMs start meanwhile.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import keyedstate
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

# the operator scenarios: inputs, queries, checks
import tests.provider.test_operator_equivalence as eq
from tests.support.paths import DRIVERS, PYTHON_SOURCES, REPO
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    REFERENCE_PROVIDER,
    BatchCollector,
    FileInput,
    await_finished,
    committed_batches,
    diff_batches,
    kill_process_group,
    normalize,
    planned_batches,
    sort_rows,
    start_query,
)

Rows = list[dict[str, Any]]
Batches = dict[int, Rows]
State = dict[tuple[int, str], Rows]  # (operator id, store name) -> rows

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
DRIVER = DRIVERS / "rescale_driver.py"
DRIVER_TIMEOUT_S = 180.0
SCENARIOS = {s.name: s for s in eq.SCENARIOS}


# ---------------------------------------------------------------------------------------------
# Checkpoints and runs


@dataclass
class Line:
    """One checkpoint and everything its runs produced (a run = one start until availableNow
    ends); ``runs[i]`` lists the batch ids of run i."""

    label: str
    path: Path
    provider: str = PROVIDER_UNDER_TEST
    collector: BatchCollector = field(default_factory=BatchCollector)
    progresses: list[list[dict[str, Any]]] = field(default_factory=list)
    runs: list[list[int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def batches(self) -> Batches:
        return self.collector.batches

    def run_batches(self, i: int) -> Batches:
        return {b: self.batches[b] for b in self.runs[i]}

    def state_partitions(self, i: int) -> set[int]:
        """numShufflePartitions of every stateful operator in every progress of run i."""
        return {
            op["numShufflePartitions"]
            for p in self.progresses[i]
            for op in p.get("stateOperators", [])
        }


def run_round(
    spark: SparkSession,
    build: Callable[[Mapping[str, DataFrame]], DataFrame],
    output_mode: str,
    lines: Sequence[tuple[Line, Mapping[str, FileInput]]],
    partitions: int,
) -> None:
    """Run the query once on each line's checkpoint over its inputs, side by side (they must be
    different queries: a checkpoint and its rescaled copy share the query id). ``partitions`` is
    the session's shuffle partition count at start: a new checkpoint pins it, a restarted one
    runs with the count its checkpoint pins. Failures are recorded in ``line.errors``."""
    previous = spark.conf.get(SHUFFLE_PARTITIONS)
    started = []
    try:
        for line, inputs in lines:
            spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))
            frames = {name: source.read_stream(spark) for name, source in inputs.items()}
            first_call = len(line.collector.calls)
            try:
                query = start_query(
                    spark, line.provider, build(frames), output_mode, line.path, line.collector
                )
            except Exception as error:  # noqa: BLE001 - recorded, asserted by the tests
                line.errors.append(f"start failed: {error}")
                line.progresses.append([])
                line.runs.append([])
                continue
            started.append((line, query, first_call))
        for line, query, _ in started:
            try:
                await_finished(query)
            except Exception as error:  # noqa: BLE001 - a failed query raises
                line.errors.append(str(error))
    finally:
        for _, query, _ in started:
            if query.isActive:
                query.stop()
        spark.conf.set(SHUFFLE_PARTITIONS, previous)
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_UNDER_TEST)
    for line, query, first_call in started:
        line.progresses.append([json.loads(p.json) for p in query.recentProgress])
        line.runs.append(list(dict.fromkeys(line.collector.calls[first_call:])))


def make_inputs(root: Path, sources: Mapping[str, StructType]) -> dict[str, FileInput]:
    return {name: FileInput(root / "input" / name, schema) for name, schema in sources.items()}


def add_phase(inputs: Mapping[str, FileInput], phase: Mapping[str, Sequence[Rows]]) -> None:
    for name, files in phase.items():
        inputs[name].add_all(files)


def local_path(path: str) -> Path:
    """A checkpoint path as reported by the JVM (``file:/...``) as a local path."""
    return Path(urlparse(path).path if path.startswith("file:") else path).resolve()


# ---------------------------------------------------------------------------------------------
# State: content, placement, metadata


def state_metadata(spark: SparkSession, checkpoint: Path) -> Rows:
    rows = spark.read.format("state-metadata").load(str(checkpoint)).collect()
    return sort_rows(normalize(r) for r in rows)


def partition_key_fields(operator: str, store: str, key_fields: list[str]) -> list[str]:
    """The key columns Spark hash-partitions a store's rows by: the join key without the value
    index for a join's keyWithIndexToValue store, the grouping key without the session start
    for session windows, else the whole key."""
    if store.endswith("keyWithIndexToValue"):
        assert key_fields[-1] == "index", key_fields
        return key_fields[:-1]
    if operator.startswith("sessionWindow"):
        assert key_fields[-1] == "sessionStartTime", key_fields
        return key_fields[:-1]
    return key_fields


def read_state(spark: SparkSession, checkpoint: Path, batch_id: int | None = None) -> State:
    """Every row of every store of every operator (the ``statestore`` source, one read per
    store), with its partition id and Spark SQL's ``hash`` of its partitioning key."""
    stores = sorted(
        {
            (r["operatorId"], r["stateStoreName"], r["operatorName"])
            for r in state_metadata(spark, checkpoint)
        }
    )
    assert stores, f"no stateful operator in {checkpoint}"
    out: State = {}
    for operator_id, store, operator in stores:
        reader = spark.read.format("statestore").option("operatorId", operator_id)
        if store != "default":
            reader = reader.option("storeName", store)
        if batch_id is not None:
            reader = reader.option("batchId", batch_id)
        df = reader.load(str(checkpoint))
        fields = partition_key_fields(operator, store, df.schema["key"].dataType.fieldNames())
        key_hash = F.hash(*[F.col("key").getField(f) for f in fields]).alias("key_hash")
        rows = df.select("key", "value", "partition_id", key_hash).collect()
        out[(operator_id, store)] = sort_rows(normalize(r) for r in rows)
    return out


def content(state: State) -> dict[tuple[int, str], Rows]:
    """The rows of each store without their partition ids."""
    return {
        store: sort_rows({"key": r["key"], "value": r["value"]} for r in rows)
        for store, rows in state.items()
    }


def misplaced(state: State, partitions: int) -> Rows:
    """Rows not in the partition Spark assigns their key: pmod(hash(key), partitions)."""
    return [
        {"store": store, **r}
        for store, rows in state.items()
        for r in rows
        if r["partition_id"] != r["key_hash"] % partitions  # Python's % is pmod for n > 0
    ]


def total_rows(state: State) -> int:
    return sum(len(rows) for rows in state.values())


def describe_content_diff(expected: State, actual: State, limit: int = 3) -> str:
    exp, act = content(expected), content(actual)
    lines = []
    for store in sorted(set(exp) | set(act)):
        e = [json.dumps(r, sort_keys=True) for r in exp.get(store, [])]
        a = [json.dumps(r, sort_keys=True) for r in act.get(store, [])]
        if e != a:
            lines.append(
                f"{store}: {len(e)} vs {len(a)} rows; "
                f"missing {[r for r in e if r not in a][:limit]}; "
                f"unexpected {[r for r in a if r not in e][:limit]}"
            )
    return "\n".join(lines)


# A running (or stopped but still loaded) provider claims its store directory with a lease file,
# and removes it when Spark unloads it (asynchronously, after the query stopped): the query's
# doing, not the rescale's, so digests leave leases out.
LEASE_FILES = re.compile(r"(^|/)\.?\.keyedstate-lease(\.crc)?$")


def tree_digest(root: Path) -> dict[str, str]:
    """Every file (hidden ones too, leases aside) and directory under root, with a content
    hash."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if LEASE_FILES.search(rel):
            continue
        if path.is_dir():
            out[rel + "/"] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def digest_diff(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return f"added {added[:8]}, removed {removed[:8]}, changed {changed[:8]}"


def assert_same_batches(expected: Batches, actual: Batches, what: str) -> None:
    diff = diff_batches(expected, actual)
    assert not diff, f"{what}: per-batch outputs differ from the never-rescaled run:\n{diff}"
    assert actual == expected


def check_result(
    result: Any,  # noqa: ANN401 - keyedstate.RescaleResult
    source: Path,
    output: Path,
    from_partitions: int,
    to_partitions: int,
    batch_id: int,
) -> None:
    assert local_path(result.source) == source.resolve(), result
    assert local_path(result.output) == output.resolve(), result
    assert (result.from_partitions, result.to_partitions) == (from_partitions, to_partitions)
    assert result.batch_id == batch_id, result


# ---------------------------------------------------------------------------------------------
# Processes: the rescale driver and the CLI, in their own process groups


class Driver:
    """A subprocess in its own process group (killed with its JVM), output to a log file."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={
                **os.environ,
                "PYSPARK_PYTHON": sys.executable,
                # short-lived JVMs: the client compiler and the serial collector start faster
                "PYSPARK_SUBMIT_ARGS": (
                    "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell"
                ),
                "PYTHONPATH": os.pathsep.join([str(PYTHON_SOURCES), str(REPO)]),
            },
        )

    @classmethod
    def script(cls, args: list[str], log: Path) -> Driver:
        return cls([sys.executable, str(DRIVER), *args], log)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill_group(self) -> None:
        kill_process_group(self.proc)
        self._out.close()

    def wait(self, timeout: float = DRIVER_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            tail = self.tail()
            raise AssertionError(f"{self.log.name}: no exit in {timeout}s:\n{tail}") from None

    def wait_for(self, pattern: str, timeout: float = DRIVER_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text()):
            assert self.alive(), f"{self.log.name} exited before '{pattern}':\n{self.tail()}"
            assert time.monotonic() < deadline, f"no '{pattern}' in {timeout}s:\n{self.tail()}"
            time.sleep(0.05)

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-n:])


def go(go_file: Path, **arguments: Any) -> None:  # noqa: ANN401
    """Let a waiting driver (``rescale_driver.py wait``) run the rescale with these arguments."""
    staging = go_file.with_name(go_file.name + ".tmp")
    staging.write_text(json.dumps(arguments))
    os.replace(staging, go_file)


# ---------------------------------------------------------------------------------------------
# Aggregation lines in three phases (chain, CLI, kills, refusals), and processes started early

AGG = SCENARIOS["agg_update"]
AGG_PHASES = [
    {"events": eq.AGG_FILES[:3]},
    {"events": eq.AGG_FILES[3:5]},
    {"events": eq.AGG_FILES[5:]},
]
AGG_N = 3
KILL_M = 5

# Kill points, by what the rescale prints to the driver's stderr ("[keyedstate rescale] ...").
KILL_POINTS = {
    # the journal is written and the split job (reading the source) starts
    "split": r"\[keyedstate rescale\] rescaling ",
    # the rescaled state is complete: publishing (metadata copy, or manifests moved in place)
    "publishing": r"\[keyedstate rescale\] (writing the query metadata|publishing the rescaled)",
}
# In place, after the kill: restart the query first (then re-run), or re-run first.
IN_PLACE_ORDERS = ["restart_first", "rerun_first"]
KILLS = [f"default-{point}" for point in KILL_POINTS] + [
    f"in_place-{point}-{order}" for point in KILL_POINTS for order in IN_PLACE_ORDERS
]


@dataclass
class AggLine:
    line: Line
    inputs: dict[str, FileInput]
    phases_added: int = 1

    def next_phase(self) -> None:
        add_phase(self.inputs, AGG_PHASES[self.phases_added])
        self.phases_added += 1


@dataclass
class AggLines:
    reference: Line  # three runs at N, never rescaled
    fresh: dict[str, AggLine]  # phase 1 done, one per test that needs one
    rescalers: dict[str, tuple[Driver, Path]]  # kill -> (waiting driver, go file)
    running_query: tuple[Driver, Path]  # a query running in another application, its checkpoint
    cli: dict[str, Driver]  # "rescale" / "inspect" runs of the CLI on fresh["cli"]
    cli_output: Path


FRESH_AGG = [
    "chain",
    "cli",
    *(f"kill-{kill}" for kill in KILLS),
    "uncommitted",
    "bad-partitions",
    "running-same-session",
    "running-other-session",
    "lease-refusal",
    "rocksdb",
]


@pytest.fixture(scope="module")
def agg_lines(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AggLines]:
    """The aggregation reference (three phases at N), a fresh checkpoint after phase 1 for each
    test below, and the other processes those tests need, started first so that their JVMs
    start while the phase-1 runs and the tests before them run."""
    root = tmp_path_factory.mktemp("agg")
    processes: list[Driver] = []
    try:
        rescalers = {}
        for kill in KILLS:
            go_file = root / f"go-{kill}.json"
            driver = Driver.script(["wait", str(go_file)], root / f"rescaler-{kill}.log")
            processes.append(driver)
            rescalers[kill] = (driver, go_file)
        elsewhere = make_inputs(root / "elsewhere", AGG.sources)
        add_phase(elsewhere, AGG_PHASES[0])
        elsewhere_checkpoint = root / "elsewhere" / "checkpoint"
        query = Driver.script(
            ["query", str(elsewhere["events"].directory), str(elsewhere_checkpoint), "3"],
            root / "running-query.log",
        )
        processes.append(query)

        ref_inputs = make_inputs(root / "reference", AGG.sources)
        reference = Line("reference", root / "reference" / "checkpoint")
        fresh = {}
        for name in FRESH_AGG:
            provider = REFERENCE_PROVIDER if name == "rocksdb" else PROVIDER_UNDER_TEST
            fresh[name] = AggLine(
                Line(name, root / name / "checkpoint", provider=provider),
                make_inputs(root / name, AGG.sources),
            )
            add_phase(fresh[name].inputs, AGG_PHASES[0])
        add_phase(ref_inputs, AGG_PHASES[0])
        # All phase-1 runs side by side (different queries, each over its own input directory).
        run_round(
            spark,
            AGG.build,
            AGG.output_mode,
            [(reference, ref_inputs), *((a.line, a.inputs) for a in fresh.values())],
            AGG_N,
        )
        for agg_line in fresh.values():
            assert not agg_line.line.errors, agg_line.line.errors
            assert agg_line.line.run_batches(0) == reference.run_batches(0)

        cli_source, cli_output = fresh["cli"].line.path, root / "cli-rescaled"
        cli = [sys.executable, "-m", "keyedstate.tools.cli"]
        # Normal priority: the CLI runs beside the test's own busy queries, which would starve it.
        spark_options = ["--master", "local[2]", "--json", "--priority", "normal"]
        cli_runs = {
            "rescale": Driver(
                [
                    *cli,
                    "rescale",
                    "--checkpoint",
                    str(cli_source),
                    "--partitions",
                    "4",
                    "--output",
                    str(cli_output),
                    *spark_options,
                ],
                root / "cli-rescale.log",
            ),
        }
        processes.extend(cli_runs.values())

        for phase in AGG_PHASES[1:]:
            add_phase(ref_inputs, phase)
            run_round(spark, AGG.build, AGG.output_mode, [(reference, ref_inputs)], AGG_N)
        assert not reference.errors, reference.errors
        AGG.check(reference.batches)
        assert [len(r) for r in reference.runs] == [3, 2, 2]
        yield AggLines(
            reference, fresh, rescalers, (query, elsewhere_checkpoint), cli_runs, cli_output
        )
    finally:
        for process in processes:
            if process.alive():
                process.kill_group()


def restart(spark: SparkSession, agg: AggLine, line: Line, partitions: int = AGG_N) -> None:
    run_round(spark, AGG.build, AGG.output_mode, [(line, agg.inputs)], partitions)


def assert_run_exact(reference: Line, line: Line, run: int, phase: int, partitions: int) -> None:
    """Run ``run`` of ``line`` = phase ``phase`` of the reference, batch for batch, at
    ``partitions`` state partitions."""
    assert not line.errors, f"{line.label}: {line.errors}"
    assert line.runs[run] == reference.runs[phase], (line.runs, reference.runs)
    assert_same_batches(reference.run_batches(phase), line.run_batches(run), line.label)
    assert line.state_partitions(run) == {partitions}, line.progresses[run]


def test_chained_rescale(spark: SparkSession, agg_lines: AggLines, tmp_path: Path) -> None:
    """3 -> 7 (to the default output) -> 2 without running in between, run; then 2 -> 5 of the
    checkpoint the query wrote at 2 partitions, and that in place to 4, run: exact output."""
    reference, agg = agg_lines.reference, agg_lines.fresh["chain"]
    source = agg.line
    last = committed_batches(source.path)[-1]
    # Without an output: <checkpoint>-rescaled-<M> next to the source.
    a = source.path.parent / f"{source.path.name}-rescaled-7"
    b, c = tmp_path / "b-2", tmp_path / "c-5"
    result = keyedstate.rescale(spark, str(source.path), 7)
    check_result(result, source.path, a, AGG_N, 7, last)
    result = keyedstate.rescale(spark, str(a), 2, str(b))
    check_result(result, a, b, 7, 2, last)
    state_b = read_state(spark, b)
    assert content(state_b) == content(read_state(spark, source.path))
    assert not misplaced(state_b, 2)

    line_b = Line("b", b)
    agg.next_phase()
    restart(spark, agg, line_b)
    assert_run_exact(reference, line_b, 0, 1, 2)

    last = committed_batches(b)[-1]
    end_b = read_state(spark, b)
    result = keyedstate.rescale(spark, str(b), 5, str(c))
    check_result(result, b, c, 2, 5, last)
    state_c = read_state(spark, c)
    assert content(state_c) == content(end_b)
    assert not misplaced(state_c, 5)
    # And C, never run, in place to 4.
    result = keyedstate.rescale(spark, str(c), 4, in_place=True)
    check_result(result, c, c, 5, 4, last)
    state_c4 = read_state(spark, c)
    assert content(state_c4) == content(end_b)
    assert not misplaced(state_c4, 4)
    line_c = Line("c", c)
    agg.next_phase()
    restart(spark, agg, line_c)
    assert_run_exact(reference, line_c, 0, 2, 4)
    assert {**reference.run_batches(0), **line_b.batches, **line_c.batches} == reference.batches


def test_cli_rescale_and_inspect(spark: SparkSession, agg_lines: AggLines) -> None:
    """``python -m keyedstate.tools.cli rescale`` (started by the fixture) writes a checkpoint that
    restarts exactly at M; ``keyedstate.inspect`` counts its keys per partition as the
    ``statestore`` source does, none misplaced."""
    reference, agg = agg_lines.reference, agg_lines.fresh["cli"]
    out = agg_lines.cli_output
    cli = agg_lines.cli["rescale"]
    rc = cli.wait()
    text = cli.text()
    assert rc == 0, text[-3000:]
    result = json.loads(text[text.index("{") : text.rindex("}") + 1])
    check_result(
        argparse.Namespace(**result),
        agg.line.path,
        out,
        AGG_N,
        4,
        committed_batches(agg.line.path)[-1],
    )

    state = read_state(spark, out)
    assert result["keys"] == total_rows(state)
    report = keyedstate.inspect(spark, str(out))
    assert report.partitions == 4 and report.provider == keyedstate.PROVIDER_CLASS, report
    assert report.batch_id == committed_batches(agg.line.path)[-1]
    counts: dict[tuple[int, str, int], int] = {}
    for (op, store), rows in state.items():
        for r in rows:
            where = (op, store, r["partition_id"])
            counts[where] = counts.get(where, 0) + 1
    reported = {
        (p.operator_id, p.store_name, p.partition): p.keys for p in report.partition_reports
    }
    assert {k: v for k, v in reported.items() if v} == counts
    assert {p.partition for p in report.partition_reports} == set(range(4))
    assert all(p.misplaced_keys == 0 for p in report.partition_reports)

    line = Line("cli", out)
    agg.next_phase()
    restart(spark, agg, line)
    assert_run_exact(reference, line, 0, 1, 4)


# ---------------------------------------------------------------------------------------------
# Interrupted rescales


def kill_at(driver: Driver, point: str) -> tuple[bool, float]:
    """Kill the driver's group as soon as its output shows ``point``. Returns whether it was
    still running then, and the seconds it took."""
    pattern = re.compile(KILL_POINTS[point])
    t0 = time.monotonic()
    while not pattern.search(driver.text()) and driver.alive():
        if time.monotonic() - t0 > DRIVER_TIMEOUT_S:
            driver.kill_group()
            raise AssertionError(f"timed out waiting for {point}:\n{driver.tail()}")
        time.sleep(0.002)
    alive = driver.alive()
    driver.kill_group()
    return alive, time.monotonic() - t0


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_default_rescale(point: str, spark: SparkSession, agg_lines: AggLines) -> None:
    """A default-mode rescale killed at ``point``: the source is byte-for-byte untouched and
    restarts exactly at N; re-running the same rescale succeeds; its output restarts exactly."""
    reference, agg = agg_lines.reference, agg_lines.fresh[f"kill-default-{point}"]
    source, out = agg.line, agg.line.path.parent / "rescaled"
    driver, go_file = agg_lines.rescalers[f"default-{point}"]
    driver.wait_for("DRIVER session")
    before = tree_digest(source.path)
    go(go_file, checkpoint=str(source.path), partitions=KILL_M, output=str(out))
    alive, at = kill_at(driver, point)
    assert alive, f"the rescale finished before the kill at {point} ({at:.2f}s):\n{driver.tail()}"
    print(f"killed at {point} after {at:.2f}s; output exists: {out.exists()}")

    after = tree_digest(source.path)
    assert after == before, f"the killed rescale changed the source: {digest_diff(before, after)}"
    agg.next_phase()
    restart(spark, agg, source)
    assert_run_exact(reference, source, 1, 1, AGG_N)

    last = committed_batches(source.path)[-1]
    try:
        result = keyedstate.rescale(spark, str(source.path), KILL_M, str(out))
    except Exception as error:
        raise AssertionError(f"re-running the rescale killed at {point} failed: {error}") from error
    check_result(result, source.path, out, AGG_N, KILL_M, last)
    assert not misplaced(read_state(spark, out), KILL_M)
    rescaled = Line("rescaled", out)
    agg.next_phase()
    restart(spark, agg, rescaled)
    assert_run_exact(reference, rescaled, 0, 2, KILL_M)


@pytest.mark.parametrize("order", IN_PLACE_ORDERS)
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_in_place_rescale(
    point: str, order: str, spark: SparkSession, agg_lines: AggLines
) -> None:
    """An in-place rescale killed at ``point``. restart_first: before publishing, the checkpoint
    restarts right away with exactly the never-rescaled output at N; killed while publishing, the
    restart is refused with a message naming the journal; then a re-run of the rescale succeeds.
    rerun_first: the re-run (the documented recovery) succeeds at once. Either way the query
    then runs on exactly, at M."""
    kill = f"in_place-{point}-{order}"
    reference, agg = agg_lines.reference, agg_lines.fresh[f"kill-{kill}"]
    source = agg.line
    driver, go_file = agg_lines.rescalers[kill]
    driver.wait_for("DRIVER session")
    go(go_file, checkpoint=str(source.path), partitions=KILL_M, in_place=True)
    alive, at = kill_at(driver, point)
    assert alive, f"the rescale finished before the kill at {point} ({at:.2f}s):\n{driver.tail()}"
    leftovers = sorted(
        str(p.relative_to(source.path)) for p in source.path.glob(".keyedstate*/**/*")
    )
    print(f"killed at {point} after {at:.2f}s; rescale files left: {leftovers[:5]}")

    problems = []
    # 1. restart_first: restart right after the kill, on phase 2.
    restarted = False
    if order == "restart_first":
        agg.next_phase()
        restart(spark, agg, source)
        restarted = not source.errors
    if restarted:
        assert source.runs[1] == reference.runs[1], (source.runs, reference.runs)
        assert_same_batches(reference.run_batches(1), source.run_batches(1), "restart after kill")
        assert source.state_partitions(1) <= {AGG_N, KILL_M}, source.progresses[1]
    elif order == "restart_first":
        message = re.sub(r"\s+", " ", source.errors[-1])
        found = re.search(r"The checkpoint \S+ is being rescaled.{0,300}", message)
        if point == "publishing" and found:
            # Killed half-way through moving the new state in: the provider must refuse (the
            # live state is mixed) and say how to complete it; the re-run below completes it.
            assert "run it again" in found.group(0), found.group(0)
        else:
            problems.append(
                "the checkpoint does not restart after the kill: "
                + (found.group(0) if found else message[:600])
            )
        source.errors.clear()

    # 2. Re-run the rescale.
    last = committed_batches(source.path)[-1]
    try:
        result = keyedstate.rescale(spark, str(source.path), KILL_M, in_place=True)
    except Exception as error:  # noqa: BLE001
        problems.append(f"re-running the rescale then fails: {str(error)[:600]}")
        raise AssertionError("\n".join(problems)) from error
    assert result.to_partitions == KILL_M and result.in_place, result
    assert result.batch_id == last, (result, last)
    state = read_state(spark, source.path)
    assert not misplaced(state, KILL_M), misplaced(state, KILL_M)[:3]

    # 3. Run on (phase 2 if not run yet, then phase 3): exact, at M.
    if not restarted:
        if agg.phases_added == 1:
            agg.next_phase()
        restart(spark, agg, source)
        assert_run_exact(reference, source, len(source.runs) - 1, 1, KILL_M)
    agg.next_phase()
    restart(spark, agg, source)
    assert_run_exact(reference, source, len(source.runs) - 1, 2, KILL_M)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# Refusals


def assert_refused(
    call: Callable[[], Any], pattern: str, checkpoint: Path, output: Path | None
) -> str:
    before = tree_digest(checkpoint)
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the message is what is checked
        call()
    message = str(caught.value)
    assert re.search(pattern, message, re.IGNORECASE | re.DOTALL), message[:2000]
    after = tree_digest(checkpoint)
    assert after == before, f"a refused rescale changed it: {digest_diff(before, after)}"
    if output is not None:
        assert not output.exists(), f"a refused rescale wrote {sorted(output.rglob('*'))[:5]}"
    return message


def test_refuses_spark_rocksdb_checkpoint(
    spark: SparkSession, agg_lines: AggLines, tmp_path: Path
) -> None:
    checkpoint = agg_lines.fresh["rocksdb"].line.path
    for in_place in (False, True):
        out = None if in_place else tmp_path / "out"
        assert_refused(
            lambda out=out, in_place=in_place: keyedstate.rescale(
                spark, str(checkpoint), 5, str(out) if out else None, in_place=in_place
            ),
            r"RocksDBStateStoreProvider",
            checkpoint,
            out,
        )


def test_refuses_bad_partition_counts(
    spark: SparkSession, agg_lines: AggLines, tmp_path: Path
) -> None:
    checkpoint = agg_lines.fresh["bad-partitions"].line.path
    out = tmp_path / "out"
    for partitions in (0, -3):
        for in_place in (False, True):
            assert_refused(
                lambda p=partitions, ip=in_place: keyedstate.rescale(
                    spark, str(checkpoint), p, None if ip else str(out), in_place=ip
                ),
                rf"partition.*{partitions}|{partitions}.*partition",
                checkpoint,
                out,
            )
    # Nor is a default output (<checkpoint>-rescaled-<n>) left behind.
    assert not list(checkpoint.parent.glob("*rescaled*"))


def test_refuses_uncommitted_last_batch(
    spark: SparkSession, agg_lines: AggLines, tmp_path: Path
) -> None:
    """The last planned batch has no commit (a query died mid-batch): refused in both modes."""
    agg = agg_lines.fresh["uncommitted"]
    checkpoint = agg.line.path
    last = committed_batches(checkpoint)[-1]
    assert planned_batches(checkpoint)[-1] == last
    (checkpoint / "commits" / str(last)).unlink()
    out = tmp_path / "out"
    for in_place in (False, True):
        message = assert_refused(
            lambda ip=in_place: keyedstate.rescale(
                spark, str(checkpoint), 5, None if ip else str(out), in_place=ip
            ),
            r"commit",
            checkpoint,
            out,
        )
        assert str(last) in message, message


@pytest.mark.parametrize("session", ["same-session", "other-session"])
def test_refuses_while_query_runs_in_this_application(
    session: str, spark: SparkSession, agg_lines: AggLines, tmp_path: Path
) -> None:
    """A query of this application runs (idle between triggers) on the checkpoint, started
    from the session that rescales or from another session of the same application
    (``spark.newSession()``, as notebooks and Spark Connect have): refused in both modes, by a
    message naming the running query, not the uncommitted-batch refusal."""
    agg = agg_lines.fresh[f"running-{session}"]
    agg.next_phase()
    runner = spark if session == "same-session" else spark.newSession()
    # The shared session's settings are put back after: later tests start their own checkpoints.
    previous = {key: runner.conf.get(key) for key in (PROVIDER_KEY, SHUFFLE_PARTITIONS)}
    runner.conf.set(PROVIDER_KEY, PROVIDER_UNDER_TEST)
    runner.conf.set(SHUFFLE_PARTITIONS, str(AGG_N))
    frames = {n: s.read_stream(runner) for n, s in agg.inputs.items()}
    collector = BatchCollector()
    query = (
        AGG.build(frames)
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(agg.line.path))
        .foreachBatch(collector)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while len(collector.calls) < 2:  # the new files are processed; the query stays up
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.05)
        query.processAllAvailable()
        out = tmp_path / "out"
        for in_place in (False, True):
            assert query.isActive
            last = committed_batches(agg.line.path)[-1]
            assert planned_batches(agg.line.path)[-1] == last  # nothing in flight
            message = assert_refused(
                lambda ip=in_place: keyedstate.rescale(
                    spark, str(agg.line.path), 5, None if ip else str(out), in_place=ip
                ),
                r"running|active|in use",
                agg.line.path,
                out,
            )
            assert "not committed" not in message, message
    finally:
        query.stop()
        for key, value in previous.items():
            runner.conf.set(key, value)


def test_refuses_while_query_runs_elsewhere(
    spark: SparkSession, agg_lines: AggLines, tmp_path: Path
) -> None:
    """The query runs in another application (a driver process, started by the fixture), idle
    between triggers after processing its input: rescaling its checkpoint is refused."""
    driver, checkpoint = agg_lines.running_query
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while len(committed_batches(checkpoint)) < 3:
        assert driver.alive(), driver.tail()
        assert time.monotonic() < deadline, driver.tail()
        time.sleep(0.1)
    time.sleep(0.5)  # between triggers, nothing in flight
    assert driver.alive(), driver.tail()
    assert committed_batches(checkpoint)[-1] == planned_batches(checkpoint)[-1]
    out = tmp_path / "out"
    for in_place in (False, True):
        assert_refused(
            lambda ip=in_place: keyedstate.rescale(
                spark, str(checkpoint), 5, None if ip else str(out), in_place=ip
            ),
            r"running|in use",
            checkpoint,
            out,
        )
    driver.kill_group()


# ---------------------------------------------------------------------------------------------
# A query with two stateful operators: dropDuplicates on (key, id), then count/sum per key.


def build_dedup_then_agg(frames: Mapping[str, DataFrame]) -> DataFrame:
    return eq.agg_by_key({"events": frames["events"].dropDuplicates(["key", "id"])})


def check_dedup_then_agg(batches: Batches) -> None:
    seen: set[tuple[str, int]] = set()
    deduped = []
    for rows in eq.DEDUP_FILES:
        fresh = []
        for row in rows:
            if (row["key"], row["id"]) not in seen:
                seen.add((row["key"], row["id"]))
                fresh.append(row)
        deduped.append(fresh)
    expected = eq.expected_update_batches(deduped)
    assert batches == expected
    assert sum(map(len, deduped)) < sum(map(len, eq.DEDUP_FILES))  # duplicates were dropped


SCENARIOS["dedup_then_agg"] = eq.Scenario(
    "dedup_then_agg",
    {"events": eq.EVENT_SCHEMA},
    eq.split(eq.DEDUP_FILES, 3),
    build_dedup_then_agg,
    "update",
    check_dedup_then_agg,
)


# ---------------------------------------------------------------------------------------------
# The operator matrix: every operator, rescaled to a new checkpoint and in place


@dataclass(frozen=True)
class Case:
    scenario: str
    n: int  # the partitions the query starts with
    copy: int  # default-mode rescale to a new checkpoint: N -> copy
    in_place: int  # in-place rescale of a second checkpoint: N -> in_place
    restart_source: bool = False  # also restart the source after its rescale (at N)

    def target(self, kind: str) -> int:
        return self.copy if kind == "copy" else self.in_place


# Each operator goes up one way and down the other; divisors and non-divisors both ways.
CASES = [
    Case("agg_update", n=3, copy=7, in_place=2, restart_source=True),
    Case("window_append_watermark", n=2, copy=3, in_place=1),
    Case("drop_duplicates", n=5, copy=2, in_place=6),
    Case("drop_duplicates_within_watermark", n=2, copy=5, in_place=1),
    Case("session_window", n=3, copy=6, in_place=2),
    Case("join_inner", n=3, copy=2, in_place=4),
    Case("join_left_outer", n=3, copy=5, in_place=2, restart_source=True),
    Case("apply_in_pandas_with_state", n=2, copy=3, in_place=1),
    Case("dedup_then_agg", n=4, copy=3, in_place=6),
]
KINDS = ["copy", "in_place"]


@dataclass
class MatrixRun:
    case: Case
    reference: Line  # N partitions, never rescaled
    source: Line  # N partitions; rescaled (default mode) to outputs["copy"] after phase 1
    outputs: dict[str, Line]  # "copy": the new checkpoint; "in_place": a second source line
    results: dict[str, Any] = field(default_factory=dict)  # kind -> RescaleResult | Exception
    phase1_batch: int = -1
    source_state: State = field(default_factory=dict)  # as of phase1_batch
    rescaled_state: dict[str, State] = field(default_factory=dict)  # right after the rescale
    rescaled_metadata: dict[str, Rows] = field(default_factory=dict)
    digest_before: dict[str, str] = field(default_factory=dict)
    digest_after: dict[str, str] = field(default_factory=dict)
    reference_end: State = field(default_factory=dict)
    end_state: dict[str, State] = field(default_factory=dict)
    end_metadata: dict[str, Rows] = field(default_factory=dict)
    setup_errors: dict[str, str] = field(default_factory=dict)


def run_matrix(spark: SparkSession, case: Case, root: Path) -> MatrixRun:
    scenario = SCENARIOS[case.scenario]
    inputs = make_inputs(root, scenario.sources)
    run = MatrixRun(
        case=case,
        reference=Line("reference", root / "reference"),
        source=Line("source", root / "source"),
        outputs={
            "copy": Line("copy", root / f"rescaled-{case.copy}"),
            "in_place": Line("in_place", root / "in-place"),
        },
    )
    in_place = run.outputs["in_place"]
    phase1, phase2 = scenario.phases
    add_phase(inputs, phase1)
    run_round(
        spark,
        scenario.build,
        scenario.output_mode,
        [(line, inputs) for line in (run.reference, run.source, in_place)],
        case.n,
    )
    for line in (run.reference, run.source, in_place):
        assert not line.errors, f"phase 1 of {line.label} failed: {line.errors}"
    run.phase1_batch = committed_batches(run.source.path)[-1]
    run.source_state = read_state(spark, run.source.path)
    run.digest_before = tree_digest(run.source.path)

    for kind in KINDS:
        line = run.outputs[kind]
        try:
            if kind == "in_place":
                run.results[kind] = keyedstate.rescale(
                    spark, str(line.path), case.in_place, in_place=True
                )
            else:
                run.results[kind] = keyedstate.rescale(
                    spark, str(run.source.path), case.copy, str(line.path)
                )
        except Exception as error:  # noqa: BLE001 - asserted by the case's test
            run.results[kind] = error
            continue
        try:
            run.rescaled_metadata[kind] = state_metadata(spark, line.path)
            run.rescaled_state[kind] = read_state(spark, line.path)
        except Exception as error:  # noqa: BLE001
            run.setup_errors[kind] = f"reading the rescaled state failed: {error}"
    run.digest_after = tree_digest(run.source.path)

    add_phase(inputs, phase2)
    ok = [run.outputs[k] for k in KINDS if not isinstance(run.results[k], Exception)]
    # A checkpoint and its rescaled copy are one query (one id): never side by side.
    rounds = [[run.reference, *ok]] + ([[run.source]] if case.restart_source else [])
    for lines in rounds:
        run_round(spark, scenario.build, scenario.output_mode, [(x, inputs) for x in lines], case.n)
    for line in ok:
        if line.errors:
            continue
        try:
            run.end_metadata[line.label] = state_metadata(spark, line.path)
            if line is in_place:  # the state it wrote at M, against the reference's at N
                run.reference_end = read_state(spark, run.reference.path)
                run.end_state[line.label] = read_state(spark, line.path)
        except Exception as error:  # noqa: BLE001
            run.setup_errors[line.label] = f"reading the state after the restart failed: {error}"
    return run


@pytest.fixture(scope="module")
def matrix(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], MatrixRun]]:
    cache: dict[str, MatrixRun] = {}
    by_name = {c.scenario: c for c in CASES}

    def get(name: str) -> MatrixRun:
        if name not in cache:
            cache[name] = run_matrix(spark, by_name[name], tmp_path_factory.mktemp(name))
        return cache[name]

    yield get


def case_id(case: Case, kind: str) -> str:
    return f"{case.scenario}-{case.n}to{case.target(kind)}-{kind}"


@pytest.mark.parametrize(
    ("case", "kind"),
    [(c, k) for c in CASES for k in KINDS],
    ids=[case_id(c, k) for c in CASES for k in KINDS],
)
def test_rescaled_restart_is_exact(
    case: Case, kind: str, matrix: Callable[[str], MatrixRun]
) -> None:
    m = case.target(kind)
    run = matrix(case.scenario)
    scenario = SCENARIOS[case.scenario]
    reference, line = run.reference, run.outputs[kind]

    # The reference itself is right (plain-Python expectations) and ran at N throughout.
    assert not reference.errors, reference.errors
    scenario.check(reference.batches)
    assert reference.state_partitions(0) == reference.state_partitions(1) == {case.n}

    result = run.results[kind]
    if isinstance(result, Exception):
        raise AssertionError(f"rescale {case.n} -> {m} ({kind}) failed: {result}") from result
    checked_source = line.path if kind == "in_place" else run.source.path
    check_result(result, checked_source, line.path, case.n, m, run.phase1_batch)
    assert result.in_place == (kind == "in_place")
    assert kind not in run.setup_errors, run.setup_errors[kind]

    # The rescaled state: the source's rows (the in-place line ran phase 1 exactly like the
    # source), each in the partition pmod(hash(key), M), and the metadata says M.
    assert not misplaced(run.source_state, case.n), "harness: keys not where Spark puts them"
    assert any(
        r["key_hash"] % m != r["key_hash"] % case.n
        for rows in run.source_state.values()
        for r in rows
    ), "no key changes partition: the placement check would prove nothing"
    rescaled = run.rescaled_state[kind]
    assert content(rescaled) == content(run.source_state), describe_content_diff(
        run.source_state, rescaled
    )
    wrong = misplaced(rescaled, m)
    assert not wrong, f"{len(wrong)} rows not in pmod(hash(key), {m}): {wrong[:3]}"
    assert {r["partition_id"] for rows in rescaled.values() for r in rows} <= set(range(m))
    assert result.keys == total_rows(run.source_state), (result.keys, total_rows(run.source_state))
    assert result.stores == len(run.source_state), result
    metadata = run.rescaled_metadata[kind]
    assert metadata and {r["numPartitions"] for r in metadata} == {m}, metadata

    # Restarted with the rest of the input (the session says N: the checkpoint decides): the
    # same batches, the same output per batch, at M partitions.
    assert not line.errors, f"restart of the rescaled checkpoint failed: {line.errors}"
    restart = len(line.runs) - 1  # the in-place line also ran phase 1
    assert line.runs[restart] == reference.runs[1], (line.runs, reference.runs)
    assert_same_batches(reference.run_batches(1), line.run_batches(restart), case_id(case, kind))
    assert any(reference.run_batches(1).values()), "phase 2 produced no output to compare"
    assert line.state_partitions(restart) == {m}, line.progresses[restart]
    # The whole output (phase 1 of the source + after the restart) is the never-rescaled one.
    whole = {**run.source.run_batches(0), **line.run_batches(restart)}
    assert whole == reference.batches
    scenario.check(whole)

    # After the restart: the metadata still says M; in place, the state equals the reference's
    # and every key is where Spark puts it under M.
    assert kind not in run.setup_errors, run.setup_errors[kind]
    assert {r["numPartitions"] for r in run.end_metadata[kind]} == {m}
    if kind == "in_place":
        end = run.end_state[kind]
        assert content(end) == content(run.reference_end), describe_content_diff(
            run.reference_end, end
        )
        assert not misplaced(end, m), misplaced(end, m)[:3]


@pytest.mark.parametrize("case", CASES, ids=[c.scenario for c in CASES])
def test_source_untouched(case: Case, matrix: Callable[[str], MatrixRun]) -> None:
    """A default-mode rescale leaves every file of the source exactly as it was (and, for some
    operators, the source then restarts at N with exactly the reference's output)."""
    run = matrix(case.scenario)
    assert not isinstance(run.results["copy"], Exception), run.results["copy"]
    assert run.digest_before and run.digest_after
    assert run.digest_after == run.digest_before, digest_diff(run.digest_before, run.digest_after)
    if case.restart_source:
        source = run.source
        assert not source.errors, source.errors
        assert source.runs[1] == run.reference.runs[1]
        assert_same_batches(run.reference.batches, source.batches, f"{case.scenario} source")
        assert source.state_partitions(1) == {case.n}


# ---------------------------------------------------------------------------------------------
# Store leases: released when the query stops, and a refusal that says when one expires


def lease_files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in (checkpoint / "state").rglob(".keyedstate-lease"))


def test_a_stopped_query_of_a_live_application_does_not_block_a_rescale(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Another application ran an availableNow query and stopped its session, and lives on (a
    notebook): its leases went with the query, so a rescale is accepted at once (they stayed
    about three minutes when only the providers' close released them)."""
    schema = StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": "key", "type": "string", "nullable": True, "metadata": {}},
                {"name": "v", "type": "long", "nullable": True, "metadata": {}},
            ],
        }
    )
    source = FileInput(tmp_path / "input", schema)
    source.add([{"key": f"k{i % 5}", "v": i} for i in range(20)])
    checkpoint = tmp_path / "checkpoint"
    driver = Driver.script(
        ["query", str(source.directory), str(checkpoint), "2", "--once"], tmp_path / "driver.log"
    )
    try:
        driver.wait_for(r"DRIVER stopped")
        assert committed_batches(checkpoint), driver.tail()
        assert lease_files(checkpoint) == [], driver.tail()
        result = keyedstate.rescale(spark, str(checkpoint), 3, str(tmp_path / "rescaled"))
        assert (result.from_partitions, result.to_partitions) == (2, 3)
    finally:
        driver.kill_group()


def test_a_refusal_for_a_lease_says_how_old_it_is_and_when_it_expires(
    spark: SparkSession, agg_lines: AggLines, tmp_path: Path
) -> None:
    checkpoint = agg_lines.fresh["lease-refusal"].line.path
    lease = checkpoint / "state" / "0" / "0" / ".keyedstate-lease"
    refreshed = int(time.time() * 1000) - 20_000
    lease.write_text(
        json.dumps(
            {
                "applicationId": "app-elsewhere",
                "queryRunId": "6f1c0e5e-0000-4000-8000-000000000000",
                "executorId": "3",
                "host": "worker-7",
                "refreshedAtMs": refreshed,
            }
        )
    )
    os.utime(lease, (refreshed / 1000, refreshed / 1000))
    message = assert_refused(
        lambda: keyedstate.rescale(spark, str(checkpoint), 5, str(tmp_path / "out")),
        r"in use by application app-elsewhere",
        checkpoint,
        tmp_path / "out",
    )
    assert re.search(r"refreshed 2\d s ago", message), message
    expires = re.search(r"this one in (\d+) s \(([^)]+)\)", message)
    assert expires and 150 <= int(expires.group(1)) <= 160, message
    lease.unlink()


# ---------------------------------------------------------------------------------------------
# Operator state (a keyed function's CheckpointedFunction lists) across a rescale


def test_operator_state_is_rescaled(spark: SparkSession, tmp_path: Path) -> None:
    """The docs' CheckpointCount: its operator lists are keyed by the partition that wrote them,
    which no key group check applies to (the rescale refused every such checkpoint), and are
    redistributed by the driver. After
    2 -> 3 and 3 -> 1 the restored counts add up to every element seen, before and after."""
    from keyedstate import examples

    source = FileInput(tmp_path / "pairs", examples.PAIRS)
    checkpoint = tmp_path / "checkpoint"
    batches = [[{"key": k, "value": k * 10 + i} for k in range(8)] for i in range(3)]

    def run(at: Path, rows: Rows) -> BatchCollector:
        source.add(rows)
        frame = keyedstate.key_by(source.read_stream(spark), "key").flat_map(
            examples.CheckpointCount(), "key long, keyed_count long, operator_count long"
        )
        collector = BatchCollector()
        await_finished(start_query(spark, PROVIDER_UNDER_TEST, frame, "append", at, collector))
        return collector

    def operator_total(at: Path) -> int:
        rows = keyedstate.state.read(spark, str(at), state="operatorState").collect()
        return sum(r["value"] for r in rows)

    run(checkpoint, batches[0])
    assert operator_total(checkpoint) == 8
    to_three = tmp_path / "three"
    keyedstate.rescale(spark, str(checkpoint), 3, str(to_three))
    assert operator_total(to_three) == 8
    collector = run(to_three, batches[1])
    assert operator_total(to_three) == 16
    # Flink's even split: the two old counts went to two of the new partitions, the third has none
    # (tests/offline/test_operator_state_redistribution.py checks each share against the rule).
    assert len({r["operator_count"] for r in collector.batches[1]}) > 1
    to_one = tmp_path / "one"
    keyedstate.rescale(spark, str(to_three), 1, str(to_one))
    assert operator_total(to_one) == 16
    collector = run(to_one, batches[2])
    # One partition: its first element continues from every element seen so far.
    assert sorted(r["operator_count"] for r in collector.batches[2]) == list(range(17, 25))
    report = keyedstate.inspect(spark, str(to_one))
    assert sum(p.misplaced_keys for p in report.partition_reports) == 0
