"""State time-to-live configuration, named as in PyFlink (``StateTtlConfig``).

TTL is kept by keyedstate's provider (docs/ttl.md): it stamps every TTL'd value (or list element,
or map entry) with its last-access time, hides or returns expired ones, and runs the cleanup
strategies. Time is the micro-batch's processing time (the trigger timestamp Spark records in the
offset log), so a replayed batch expires exactly what the first attempt expired. This module only
configures it: the engine passes the configuration to the provider, and writes back what a
function read under ``OnReadAndWrite``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from keyedstate.state.time import Time

__all__ = ["StateTtlConfig"]


class StateTtlConfig:
    """Time-to-live of a state's values; build with ``StateTtlConfig.new_builder(Time...)``."""

    class UpdateType(Enum):
        """When the last-access timestamp, which prolongs the TTL, is refreshed."""

        Disabled = 0
        OnCreateAndWrite = 1
        OnReadAndWrite = 2

    class StateVisibility(Enum):
        """Whether an expired value that has not been cleaned up yet may be returned."""

        ReturnExpiredIfNotCleanedUp = 0
        NeverReturnExpired = 1

    class TtlTimeCharacteristic(Enum):
        """The time scale of TTL: processing time (the micro-batch's timestamp)."""

        ProcessingTime = 0

    @dataclass(frozen=True)
    class IncrementalCleanupStrategy:
        cleanup_size: int
        run_cleanup_for_every_record: bool

    @dataclass(frozen=True)
    class RocksdbCompactFilterCleanupStrategy:
        query_time_after_num_entries: int
        periodic_compaction_time: Time | None

    class CleanupStrategies:
        """The cleanup strategies configured on a :class:`StateTtlConfig`."""

        def __init__(
            self,
            full_snapshot: bool,
            incremental: StateTtlConfig.IncrementalCleanupStrategy | None,
            compact_filter: StateTtlConfig.RocksdbCompactFilterCleanupStrategy | None,
            is_cleanup_in_background: bool,
        ) -> None:
            self._full_snapshot = full_snapshot
            self._incremental = incremental
            self._compact_filter = compact_filter
            self._is_cleanup_in_background = is_cleanup_in_background

        def is_cleanup_in_background(self) -> bool:
            return self._is_cleanup_in_background

        def in_full_snapshot(self) -> bool:
            return self._full_snapshot

        def get_incremental_cleanup_strategy(
            self,
        ) -> StateTtlConfig.IncrementalCleanupStrategy | None:
            return self._incremental

        def get_rocksdb_compact_filter_cleanup_strategy(
            self,
        ) -> StateTtlConfig.RocksdbCompactFilterCleanupStrategy | None:
            return self._compact_filter

        def __repr__(self) -> str:
            return (
                f"CleanupStrategies(full_snapshot={self._full_snapshot}, "
                f"incremental={self._incremental}, compact_filter={self._compact_filter}, "
                f"in_background={self._is_cleanup_in_background})"
            )

    def __init__(
        self,
        update_type: StateTtlConfig.UpdateType,
        state_visibility: StateTtlConfig.StateVisibility,
        ttl_time_characteristic: StateTtlConfig.TtlTimeCharacteristic,
        ttl: Time,
        cleanup_strategies: StateTtlConfig.CleanupStrategies,
    ) -> None:
        self._update_type = update_type
        self._state_visibility = state_visibility
        self._ttl_time_characteristic = ttl_time_characteristic
        self._ttl = ttl
        self._cleanup_strategies = cleanup_strategies

    @staticmethod
    def new_builder(ttl: Time) -> StateTtlConfig.Builder:
        return StateTtlConfig.Builder(ttl)

    def get_update_type(self) -> StateTtlConfig.UpdateType:
        return self._update_type

    def get_state_visibility(self) -> StateTtlConfig.StateVisibility:
        return self._state_visibility

    def get_ttl(self) -> Time:
        return self._ttl

    def get_ttl_time_characteristic(self) -> StateTtlConfig.TtlTimeCharacteristic:
        return self._ttl_time_characteristic

    def is_enabled(self) -> bool:
        return self._update_type is not StateTtlConfig.UpdateType.Disabled

    def get_cleanup_strategies(self) -> StateTtlConfig.CleanupStrategies:
        return self._cleanup_strategies

    # Engine-facing shorthands.
    @property
    def ttl_ms(self) -> int:
        return self._ttl.to_milliseconds()

    @property
    def update_on_read(self) -> bool:
        return self._update_type is StateTtlConfig.UpdateType.OnReadAndWrite

    @property
    def return_expired(self) -> bool:
        return self._state_visibility is StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp

    def __repr__(self) -> str:
        return (
            f"StateTtlConfig<update_type={self._update_type}, "
            f"state_visibility={self._state_visibility}, "
            f"ttl_time_characteristic={self._ttl_time_characteristic}, ttl={self._ttl}, "
            f"cleanup={self._cleanup_strategies}>"
        )

    class Builder:
        """Builder of a :class:`StateTtlConfig` (PyFlink's method names)."""

        def __init__(self, ttl: Time) -> None:
            self._ttl = Time.of(ttl)
            self._update_type = StateTtlConfig.UpdateType.OnCreateAndWrite
            self._state_visibility = StateTtlConfig.StateVisibility.NeverReturnExpired
            self._ttl_time_characteristic = StateTtlConfig.TtlTimeCharacteristic.ProcessingTime
            self._is_cleanup_in_background = True
            self._full_snapshot = False
            self._incremental: StateTtlConfig.IncrementalCleanupStrategy | None = None
            self._compact_filter: StateTtlConfig.RocksdbCompactFilterCleanupStrategy | None = None

        def set_update_type(self, update_type: StateTtlConfig.UpdateType) -> StateTtlConfig.Builder:
            if not isinstance(update_type, StateTtlConfig.UpdateType):
                raise TypeError(f"expected a StateTtlConfig.UpdateType, got {update_type!r}")
            self._update_type = update_type
            return self

        def update_ttl_on_create_and_write(self) -> StateTtlConfig.Builder:
            return self.set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)

        def update_ttl_on_read_and_write(self) -> StateTtlConfig.Builder:
            return self.set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)

        def set_state_visibility(
            self, state_visibility: StateTtlConfig.StateVisibility
        ) -> StateTtlConfig.Builder:
            if not isinstance(state_visibility, StateTtlConfig.StateVisibility):
                raise TypeError(
                    f"expected a StateTtlConfig.StateVisibility, got {state_visibility!r}"
                )
            self._state_visibility = state_visibility
            return self

        def return_expired_if_not_cleaned_up(self) -> StateTtlConfig.Builder:
            return self.set_state_visibility(
                StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
            )

        def never_return_expired(self) -> StateTtlConfig.Builder:
            return self.set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)

        def set_ttl_time_characteristic(
            self, ttl_time_characteristic: StateTtlConfig.TtlTimeCharacteristic
        ) -> StateTtlConfig.Builder:
            if ttl_time_characteristic is not StateTtlConfig.TtlTimeCharacteristic.ProcessingTime:
                raise ValueError("only processing-time TTL is supported (as in Flink)")
            self._ttl_time_characteristic = ttl_time_characteristic
            return self

        def use_processing_time(self) -> StateTtlConfig.Builder:
            return self.set_ttl_time_characteristic(
                StateTtlConfig.TtlTimeCharacteristic.ProcessingTime
            )

        def cleanup_full_snapshot(self) -> StateTtlConfig.Builder:
            """Drop every expired entry of a bucket whenever the bucket is written (a commit)."""
            self._full_snapshot = True
            return self

        def cleanup_incrementally(
            self, cleanup_size: int, run_cleanup_for_every_record: bool
        ) -> StateTtlConfig.Builder:
            """Check up to ``cleanup_size`` expired keys of the bucket on each invocation (or on
            each record with ``run_cleanup_for_every_record``) and drop their expired entries."""
            if cleanup_size < 0:
                raise ValueError("cleanup_size must not be negative")
            self._incremental = StateTtlConfig.IncrementalCleanupStrategy(
                int(cleanup_size), bool(run_cleanup_for_every_record)
            )
            return self

        def cleanup_in_rocksdb_compact_filter(
            self,
            query_time_after_num_entries: int,
            periodic_compaction_time: Time | None = None,
        ) -> StateTtlConfig.Builder:
            """Background cleanup: expired entries are dropped without any access to their key
            (in processing-time timer mode the bucket wakes up at the earliest expiry)."""
            if query_time_after_num_entries < 0:
                raise ValueError("query_time_after_num_entries must not be negative")
            self._compact_filter = StateTtlConfig.RocksdbCompactFilterCleanupStrategy(
                int(query_time_after_num_entries),
                None if periodic_compaction_time is None else Time.of(periodic_compaction_time),
            )
            return self

        # The spelling of older PyFlink releases.
        cleanup_in_rocks_db_compact_filter = cleanup_in_rocksdb_compact_filter

        def disable_cleanup_in_background(self) -> StateTtlConfig.Builder:
            self._is_cleanup_in_background = False
            return self

        def set_ttl(self, ttl: Time) -> StateTtlConfig.Builder:
            self._ttl = Time.of(ttl)
            return self

        def build(self) -> StateTtlConfig:
            if self._ttl.to_milliseconds() <= 0:
                raise ValueError(f"TTL must be positive, got {self._ttl}")
            return StateTtlConfig(
                self._update_type,
                self._state_visibility,
                self._ttl_time_characteristic,
                self._ttl,
                StateTtlConfig.CleanupStrategies(
                    self._full_snapshot,
                    self._incremental,
                    self._compact_filter,
                    self._is_cleanup_in_background,
                ),
            )
