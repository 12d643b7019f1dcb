"""Checkpoints on S3 (s3a): tests/storage/storage_suite.py against moto's S3 server on
127.0.0.1, started for the session (tests/support/servers/s3_endpoint.py, s3a jars from `make
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
def storage(s3_endpoint: object) -> object:
    return s3_endpoint


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # In CI: the layouts with the most files per version: an aggregation's and a join's four stores.
    parametrize_equivalence(metafunc, {"agg_update", "join_inner"})
