"""SIGKILL the whole driver (Python + JVM) at random points; restarts must be exactly-once.

The driver (tests/support/drivers/agg_driver.py) runs a count/sum per key over NUM_FILES input
files, one file per micro-batch, and writes each batch's output idempotently: with Spark's streaming
aggregation (update mode), and with a keyedstate Python API function (a ValueState per key). This
test kills its process group at seeded random points in different phases (JVM startup, mid-batch,
right after a commit, after a random delay) and restarts it on the same checkpoint until it
finishes. Per-batch and final results must equal the values computed here in plain Python; with
KILL_TEST_CLEAN_RUN=1 (``make soak``) the same driver also runs uninterrupted on a fresh checkpoint,
alongside, and must write the same.

KILL_TEST_SEED picks the kill points; the seed and the kill log are printed. KILL_TEST_KILLS sets
how many kills (4 by default; `make soak` runs 100, with as many input files as they need) and
KILL_TEST_BUDGET_S bounds the time spent killing (the run then finishes with the kills made).
``run_kill_test`` is the test itself, for other checkpoint locations
(tests/storage/storage_suite.py runs it with checkpoints on HDFS and S3).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.support.driver_process import Driver, wait_for
from tests.support.paths import DRIVERS
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    FileInput,
    committed_batches,
    planned_batches,
)

DRIVER = DRIVERS / "agg_driver.py"
KILLS = int(os.environ.get("KILL_TEST_KILLS", "4"))
KILL_BUDGET_S = float(os.environ.get("KILL_TEST_BUDGET_S", "3600"))
CLEAN_RUN = os.environ.get("KILL_TEST_CLEAN_RUN") == "1"
# Every kill after the first waits for 1 to 5 more commits: enough batches for all of them.
NUM_FILES = max(30, 5 * KILLS + 10)
ROWS_PER_FILE = 12
NUM_KEYS = 10
SEED = int(os.environ.get("KILL_TEST_SEED", "20240611"))
WAIT_TIMEOUT_S = 150.0

SCHEMA = StructType([StructField("key", StringType()), StructField("v", LongType())])


@dataclass
class Kill:
    phase: str
    attempt: int
    alive_before_kill: bool
    commits_before: list[int]
    offsets_before: list[int]
    commits_after: list[int]
    offsets_after: list[int]

    @property
    def mid_batch(self) -> bool:
        """A batch was planned (offsets/N written) but not committed when the driver died."""
        return bool(self.offsets_after) and (
            not self.commits_after or self.offsets_after[-1] > self.commits_after[-1]
        )

    def __str__(self) -> str:
        last = lambda xs: xs[-1] if xs else None  # noqa: E731
        return (
            f"attempt {self.attempt}: phase={self.phase} alive={self.alive_before_kill} "
            f"last offset/commit before kill={last(self.offsets_before)}/"
            f"{last(self.commits_before)} after kill={last(self.offsets_after)}/"
            f"{last(self.commits_after)}"
            f" mid_batch={self.mid_batch}"
        )


def make_input(directory: Path, num_files: int = NUM_FILES) -> list[list[dict[str, Any]]]:
    rng = random.Random(7)
    source = FileInput(directory, SCHEMA)
    files = []
    for _ in range(num_files):
        rows = [
            {"key": f"k{rng.randrange(NUM_KEYS)}", "v": rng.randrange(1, 1000)}
            for _ in range(ROWS_PER_FILE)
        ]
        source.add(rows)
        files.append(rows)
    return files


def expected_batches(files: list[list[dict[str, Any]]]) -> dict[int, list[dict[str, Any]]]:
    """Each file's batch output when every batch reads one file."""
    states = running_states(files)
    return {batch: output_of(files, states, batch, batch) for batch in range(len(files))}


def running_states(files: list[list[dict[str, Any]]]) -> list[dict[str, dict[str, int]]]:
    """The count and sum per key after each file."""
    state: dict[str, dict[str, int]] = {}
    states = []
    for rows in files:
        for row in rows:
            agg = state.setdefault(row["key"], {"cnt": 0, "total": 0})
            state[row["key"]] = {"cnt": agg["cnt"] + 1, "total": agg["total"] + row["v"]}
        states.append(dict(state))
    return states


def output_of(
    files: list[list[dict[str, Any]]],
    states: list[dict[str, dict[str, int]]],
    first: int,
    last: int,
) -> list[dict[str, Any]]:
    """What one micro-batch reading files ``first``..``last`` outputs (update mode)."""
    keys = sorted({row["key"] for rows in files[first : last + 1] for row in rows})
    return [{"key": k, **states[last][k]} for k in keys]


def file_ranges(
    batches: dict[int, list[dict[str, Any]]], files: list[list[dict[str, Any]]]
) -> list[tuple[int, int]]:
    """For each batch in order, the input files (first, last) whose rows give exactly its
    output, taking the files from where the previous batch stopped; a batch that no range of up
    to 4 files explains fails."""
    states = running_states(files)
    ranges: list[tuple[int, int]] = []
    first = 0
    for batch in sorted(batches):
        for last in range(first, min(first + 4, len(files))):
            if batches[batch] == output_of(files, states, first, last):
                ranges.append((first, last))
                first = last + 1
                break
        else:
            raise AssertionError(
                f"batch {batch} is the output of no files from file {first} on: "
                f"{batches[batch]}"
            )
    return ranges



def read_outputs(output_dir: Path) -> dict[int, list[dict[str, Any]]]:
    outputs = {}
    for path in output_dir.glob("batch-*.json"):
        batch = int(path.stem.split("-", 1)[1])
        outputs[batch] = sorted(json.loads(path.read_text()), key=lambda r: r["key"])
    return outputs


def final_per_key(batches: dict[int, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    final: dict[str, dict[str, Any]] = {}
    for batch in sorted(batches):
        for row in batches[batch]:
            final[row["key"]] = row
    return final


@pytest.mark.parametrize("engine", ["aggregation", "python-api"])
@pytest.mark.timeout(min(KILL_BUDGET_S, 150 * KILLS) + 600)  # the kills, then the last run
def test_kill_and_restart_is_exactly_once(
    engine: str, tmp_path: Path, drivers: list[Driver]
) -> None:
    run_kill_test(engine, tmp_path, drivers, clean_run=CLEAN_RUN)


def run_kill_test(
    engine: str,
    tmp_path: Path,
    drivers: list[Driver],
    *,
    num_kills: int = KILLS,
    num_files: int = NUM_FILES,
    checkpoint_uri: str | None = None,
    list_commits: Callable[[], list[int]] | None = None,
    list_offsets: Callable[[], list[int]] | None = None,
    env: dict[str, str] | None = None,
    clean_run: bool = True,
) -> None:
    """Kills and restarts over a checkpoint at ``checkpoint_uri`` (a local one by default),
    whose commit and offset log entries ``list_commits``/``list_offsets`` list; ``env`` goes to
    every driver. Without ``clean_run`` the result is checked against the values computed here
    only, not against an uninterrupted driver as well."""
    rng = random.Random(SEED)
    print(f"KILL_TEST_SEED={SEED} provider={PROVIDER_UNDER_TEST} engine={engine}")
    files = make_input(tmp_path / "input", num_files)
    expected = expected_batches(files)

    local_checkpoint = tmp_path / "killed" / "checkpoint"
    checkpoint = checkpoint_uri or str(local_checkpoint)
    listed_commits = list_commits or (lambda: committed_batches(local_checkpoint))
    listed_offsets = list_offsets or (lambda: planned_batches(local_checkpoint))
    output = tmp_path / "killed" / "output"
    args = [str(tmp_path / "input"), checkpoint, str(output), PROVIDER_UNDER_TEST, engine]

    def commits() -> int:  # batches committed so far (old commit files get purged: use the id)
        done = listed_commits()
        return done[-1] + 1 if done else 0

    def in_flight() -> bool:
        offsets, done = listed_offsets(), listed_commits()
        return bool(offsets) and (not done or offsets[-1] > done[-1])

    # Each phase waits for a point in the run, then kills the driver's whole process group.
    def startup(driver: Driver) -> None:  # while the JVM starts / the query initializes
        time.sleep(rng.uniform(0.5, 4.0))

    def mid_batch(driver: Driver) -> None:  # a batch is planned but not yet committed
        target = commits() + rng.randint(2, 5)
        wait_for(driver, lambda: commits() >= target, f"{target} commits", WAIT_TIMEOUT_S)
        time.sleep(rng.uniform(0.0, 0.3))
        wait_for(driver, in_flight, "a batch in flight", WAIT_TIMEOUT_S)  # then kill at once

    def after_commit(driver: Driver) -> None:  # right after a commit (maintenance, next plan)
        target = commits() + rng.randint(2, 4)
        wait_for(driver, lambda: commits() >= target, f"{target} commits", WAIT_TIMEOUT_S)

    def random_delay(driver: Driver) -> None:  # any point after some progress
        target = commits() + rng.randint(1, 3)
        wait_for(driver, lambda: commits() >= target, f"{target} commits", WAIT_TIMEOUT_S)
        time.sleep(rng.uniform(0.0, 1.5))

    later = [mid_batch, after_commit, random_delay]
    rng.shuffle(later)
    if num_kills < 4:  # too few kills for every kind: keep the one into a batch in flight
        later.sort(key=lambda phase: phase is not mid_batch)
    # Startup first, while nothing is committed yet; each later kind once, then at random.
    phases = [startup, *later, *(rng.choice(later) for _ in range(num_kills - 4))]
    phases = phases[: max(num_kills, 1)]

    # The same driver, uninterrupted, on a fresh checkpoint (concurrently, to save time).
    clean_output = tmp_path / "clean" / "output"
    clean_args = [
        str(tmp_path / "input"),
        str(tmp_path / "clean" / "checkpoint"),
        str(clean_output),
        PROVIDER_UNDER_TEST,
        engine,
    ]
    t0 = time.monotonic()
    clean = Driver(clean_args, tmp_path / "driver-clean.log", script=DRIVER) if clean_run else None
    if clean is not None:
        drivers.append(clean)

    kills: list[Kill] = []
    for attempt, phase in enumerate(phases):
        if time.monotonic() - t0 > KILL_BUDGET_S:
            print(f"kill budget of {KILL_BUDGET_S:.0f}s spent after {len(kills)} kills")
            break
        driver = Driver(args, tmp_path / f"driver-{attempt}.log", env, script=DRIVER)
        drivers.append(driver)
        phase(driver)
        before = (listed_commits(), listed_offsets())
        alive = driver.alive()
        driver.kill_group()
        kill = Kill(
            phase=phase.__name__,
            attempt=attempt,
            alive_before_kill=alive,
            commits_before=before[0],
            offsets_before=before[1],
            commits_after=listed_commits(),
            offsets_after=listed_offsets(),
        )
        kills.append(kill)
        print(f"kill at {time.monotonic() - t0:.1f}s: {kill}")
        assert alive, f"driver had already exited when killed ({kill}):\n{driver.tail()}"

    # Restart until the driver finishes by itself.
    final = Driver(args, tmp_path / "driver-final.log", env, script=DRIVER)
    drivers.append(final)
    rc = final.wait(timeout=WAIT_TIMEOUT_S * 2)
    print(f"final restart finished at {time.monotonic() - t0:.1f}s")
    assert rc == 0, f"restarted driver failed (rc={rc}):\n{final.tail()}"

    log = "\n".join(map(str, kills))
    assert len(kills) >= min(3, num_kills), log
    assert any(k.commits_before for k in kills), f"no kill after a committed batch:\n{log}"
    assert any(k.mid_batch for k in kills), f"no kill hit a batch in flight:\n{log}"
    assert len({k.commits_before[-1] if k.commits_before else -1 for k in kills}) >= 3, log

    if clean is None:
        clean_batches = expected
    else:
        rc = clean.wait(timeout=WAIT_TIMEOUT_S * 2)
        print(f"uninterrupted run finished at {time.monotonic() - t0:.1f}s")
        assert rc == 0, f"uninterrupted driver failed (rc={rc}):\n{clean.tail()}"
        clean_batches = read_outputs(clean_output)
    killed_batches = read_outputs(output)
    assert clean_batches == expected, "the uninterrupted run is wrong"
    assert sorted(killed_batches) == list(range(len(killed_batches))), log
    assert listed_commits()[-1] == len(killed_batches) - 1, log
    # Each batch of the killed run read one input file, or a few: a kill after Spark's file
    # source logged a batch's file but before the offset log named the batch leaves that file
    # to the next run's first batch, with the next file (seen in the 100-kill soak). Each
    # batch must equal the output of the files it covers, every file covered once, in order.
    ranges = file_ranges(killed_batches, files)
    assert [f for first, last in ranges for f in range(first, last + 1)] == list(
        range(num_files)
    ), f"files not covered once each, in order: {ranges}\n{log}"
    merged = [(b, r) for b, r in enumerate(ranges) if r[0] != r[1]]
    print(f"batches that read more than one file: {merged or 'none'}")
    for batch, (first, last) in enumerate(ranges):
        if first == last:
            assert killed_batches[batch] == clean_batches[first], (
                f"batch {batch} differs after kills (seed {SEED}):\n{log}\n"
                f"killed: {killed_batches[batch]}\nclean:  {clean_batches[first]}"
            )
    assert final_per_key(killed_batches) == final_per_key(clean_batches)
    totals = final_per_key(expected)
    assert len(totals) == NUM_KEYS
    assert final_per_key(killed_batches) == totals
