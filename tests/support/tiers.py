"""The CI tier and the full tier of the Python suites (docs/testing.md, "make soak" is a third).

``make test`` (CI) runs every test module, and each scenario at least once; ``make test-full``
(``KEYEDSTATE_TEST_FULL=1``) also runs what only repeats a scenario CI runs, on another engine
or with other parameters: the tests listed here (skipped in CI, with the reason), the storage
suites' other scenarios and kill tests (tests/storage/storage_suite.py) and the pipeline's last
two kill points (tests/sinks/test_exactly_once_pipeline.py). ``make soak`` is longer still.
"""

from __future__ import annotations

import os

FULL = os.environ.get("KEYEDSTATE_TEST_FULL") == "1"

# The Connect run of a state API or supervisor test whose classic run CI keeps: Connect's own
# path (planning keyed functions as relations, the server's sessions, errors mapped from the
# server) stays in CI through tests/engine/test_connect.py, test_connect_kill_restart.py,
# tests/sinks/test_sinks_on_connect.py and the Connect runs not listed here.
_CONNECT_REPEATS = [
    "tests/api/test_state_api_examples.py::test_tutorial_examples_across_a_restart",
    "tests/api/test_state_api_ttl.py::test_ttl_update_types_and_visibility",
    "tests/api/test_state_api_ttl.py::test_expired_state_is_removed_by_the_providers_cleanup",
    "tests/api/test_state_api_ttl.py::test_session_ttl_defaults_do_not_reach_keyed_functions",
    "tests/api/test_state_api_timers.py::test_processing_time_timers_fire_once_and_leave_the_store",
    "tests/api/test_state_api_types.py::test_a_row_field_named_count_reads_as_the_field",
    "tests/api/test_state_api_types.py::test_keys_spark_groups_as_one_are_one_key",
    "tests/api/test_state_api_validation.py::test_a_failed_batch_is_replayed_exactly_once",
    "tests/api/test_state_api_validation.py::test_wrong_values_fail_with_the_state_or_column_named",
    "tests/api/test_state_api_validation.py::test_changing_the_key_columns_of_a_checkpoint_is_refused",
    "tests/runtime/test_restart_strategies.py::"
    "test_failed_batches_are_restarted_from_the_checkpoint_exactly_once",
    "tests/runtime/test_checkpoint_config.py::"
    "test_a_batch_starting_sooner_than_the_min_pause_is_reported",
]

# Test ids (a parametrized id's prefix) that only the full tier runs, with why CI may leave them.
FULL_TIER: dict[str, str] = {
    **{
        f"{test}[connect": "the Connect run; CI runs it in the classic session"
        for test in _CONNECT_REPEATS
    },
    # Rescaled restarts: CI keeps one operator of each store layout (an aggregation, a
    # watermarked deduplication, a join, a session window, applyInPandasWithState).
    "tests/offline/test_rescale_exactness.py::test_rescaled_restart_is_exact[dedup_then_agg-": (
        "an aggregation after a deduplication; CI rescales each alone"
    ),
    "tests/offline/test_rescale_exactness.py::test_rescaled_restart_is_exact[drop_duplicates-": (
        "CI rescales the watermarked deduplication"
    ),
    "tests/offline/test_rescale_exactness.py::test_rescaled_restart_is_exact[join_inner-": (
        "CI rescales the left outer join (the inner join's stores and more)"
    ),
    "tests/offline/test_rescale_exactness.py::"
    "test_rescaled_restart_is_exact[window_append_watermark-": (
        "CI rescales the update aggregation (the same store layout)"
    ),
    # The same scenarios' check that the rescale left its source untouched (it runs their matrix).
    **{
        f"tests/offline/test_rescale_exactness.py::test_source_untouched[{scenario}]": (
            "its rescaled restart is in the full tier; CI checks the source of the others"
        )
        for scenario in (
            "dedup_then_agg",
            "drop_duplicates",
            "join_inner",
            "window_append_watermark",
        )
    },
    "tests/provider/test_executors.py::test_speculative_attempts_keep_state_exact": (
        "speculation end to end on a standalone cluster; CI keeps two attempts of a task writing "
        "one store version at every interleaving point (ConcurrentAttemptsSuite) and an executor "
        "lost on the cluster (test_executor_lost_during_background_snapshot_upload)"
    ),
    # The check is SparkVersionCheck's, the same on every version: CI runs it on the oldest.
    **{
        "tests/versions/test_spark_versions.py::"
        f"test_a_jar_of_another_spark_is_refused_naming_both[{v}]": (
            "the same check as on Spark 4.0, which CI runs"
        )
        for v in ("4.1", "4.2")
    },
    "tests/offline/test_savepoints.py::"
    "test_a_restored_savepoint_continues_as_the_uninterrupted_query[canonical-join-to-3]": (
        "CI restores a join's canonical savepoint at another count in test_savepoint_operators.py"
    ),
}


def full_tier_reason(nodeid: str) -> str | None:
    """Why CI leaves the test ``nodeid`` to the full tier, or None when CI runs it."""
    for prefix, reason in FULL_TIER.items():
        if nodeid.startswith(prefix):
            return reason
    return None
