"""Checkpoints on HDFS: tests/storage/storage_suite.py against a MiniDFSCluster with 3
datanodes, started for the session (tests/support/servers/hdfs_cluster.py, jars from `make
storage`)."""

from __future__ import annotations

import pytest

from tests.storage.storage_suite import (  # noqa: F401 - the tests this module runs
    parametrize_equivalence,
    remote,
    test_kill_and_restart_is_exactly_once,
    test_operator_same_output_as_reference,
    test_python_api_same_output_as_on_local_checkpoint,
    test_rescale_then_continue,
    test_savepoint_moves_to_the_storage_and_back,
    test_ttl_aggregation,
)


@pytest.fixture(scope="module")
def storage(hdfs_cluster: object) -> object:
    return hdfs_cluster


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # In CI: a watermarked window's and a Python state function's (column families of timeouts).
    parametrize_equivalence(metafunc, {"window_append_watermark", "apply_in_pandas_with_state"})
