"""The machine's registry of query services, as the CLI reads it (no Spark): an entry is found by
its checkpoint however the location is written, and skipped when its process is gone, when
another user could read it (it holds a token), or when it does not parse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from keyedstate.service import registry_folder, service_address


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "registry"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("KEYEDSTATE_SERVICE_REGISTRY", str(folder))
    assert registry_folder() == folder
    return folder


def _entry(folder: Path, run_id: str, checkpoint: str, pid: int, mode: int = 0o600) -> Path:
    path = folder / f"{run_id}.json"
    path.write_text(
        json.dumps({
            "url": "http://127.0.0.1:1", "token": "t" * 48, "queryId": "q-" + run_id,
            "runId": run_id, "checkpoint": checkpoint, "applicationId": "local-1", "pid": pid,
            "writtenAtMs": 0,
        })
    )  # fmt: skip
    path.chmod(mode)
    return path


def test_an_entry_is_found_by_its_checkpoint_however_the_location_is_written(
    registry: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    _entry(registry, "other", f"file:{tmp_path / 'elsewhere'}", os.getpid())
    _entry(registry, "run-1", f"file:{checkpoint}", os.getpid())
    for location in (str(checkpoint), f"file:{checkpoint}", f"file://{checkpoint}/"):
        found = service_address(location)
        assert found is not None and found.run_id == "run-1", location
    monkeypatch.chdir(tmp_path)
    assert service_address("ck") is not None  # relative to this process's directory
    assert service_address(str(tmp_path / "nothing-runs-here")) is None
    assert service_address("hdfs://nn/ck") is None


def test_entries_of_a_dead_process_of_others_or_garbled_are_skipped(
    registry: Path, tmp_path: Path
) -> None:
    checkpoint = f"file:{tmp_path / 'ck'}"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    _entry(registry, "dead", checkpoint, int(gone.stdout))
    assert service_address(checkpoint) is None
    _entry(registry, "readable", checkpoint, os.getpid(), mode=0o644)
    assert service_address(checkpoint) is None
    (registry / "garbled.json").write_text("{not json")
    (registry / "garbled.json").chmod(0o600)
    assert service_address(checkpoint) is None
    _entry(registry, "live", checkpoint, os.getpid())
    found = service_address(checkpoint)
    assert found is not None and found.run_id == "live"
