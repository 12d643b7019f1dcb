"""The keyed state of one bucket of keys, as the engine holds it during one invocation.

Layout of a bucket's stored state (one Spark state row, a pickled dict):

``keys``    key -> pickled record; a record is ``{state name: stored value}`` of one key
``pt``/``et`` processing-/event-time timers, ``{(timestamp, key): None}`` (insertion ordered)
``exp``     TTL'd state name -> ``{key: earliest expiration time}``, so expired keys are found
            without unpickling every key
``op``      operator (per-bucket) list states
``schema``  state name -> (kind, Spark type, has TTL), checked when the state is registered

Only the records of keys that are processed (or cleaned up) in an invocation are unpickled and
written back; the others stay as the bytes they were stored as.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

from keyedstate.state.descriptors import KeyedStateError, StateDescriptor
from keyedstate.state.states import _Handle, create_handle

__all__ = ["FORMAT_VERSION", "MIN_TIME", "KeyedStateBackend"]

FORMAT_VERSION = 1
MIN_TIME = -(2**63)
_PROTOCOL = 5


class _CleanupPlan:
    """What a TTL'd state's cleanup strategies ask of the engine."""

    __slots__ = ("purge_on_write", "all_expired_on_write", "incremental", "per_record", "wakeup")

    def __init__(self, handle: _Handle) -> None:
        ttl = handle.descriptor.ttl_config
        assert ttl is not None
        strategies = ttl.get_cleanup_strategies()
        incremental = strategies.get_incremental_cleanup_strategy()
        compact = strategies.get_rocksdb_compact_filter_cleanup_strategy()
        background = strategies.is_cleanup_in_background()
        full = strategies.in_full_snapshot()
        self.purge_on_write = background or full or incremental is not None or compact is not None
        self.all_expired_on_write = background or full or compact is not None
        self.incremental = incremental.cleanup_size if incremental is not None else 0
        self.per_record = incremental.run_cleanup_for_every_record if incremental else False
        self.wakeup = compact is not None


class KeyedStateBackend:
    """Keyed, timer and operator state of the bucket being processed (one per task)."""

    def __init__(self) -> None:
        # The record of the current key: the state objects read and write it.
        self.cur: dict[str, Any] = {}
        self.cur_key: Any = None
        self.now = 0
        self.watermark = MIN_TIME
        self.handles: dict[str, _Handle] = {}
        self._plans: dict[str, _CleanupPlan] = {}
        self.bucket_id = -1
        self.num_buckets = 0
        self.restored = False
        self.records_processed = 0
        self.timers_changed = False
        self._blobs: dict[Any, bytes] = {}
        self._records: dict[Any, dict[str, Any]] = {}
        self.ptimers: dict[tuple[int, Any], None] = {}
        self.etimers: dict[tuple[int, Any], None] = {}
        self._exp: dict[str, dict[Any, int]] = {}
        self.op_state: dict[str, list[Any]] = {}
        self._schema: dict[str, tuple[str, str, bool]] = {}

    # -----------------------------------------------------------------------------------------
    # Registration

    def register(self, descriptor: StateDescriptor, kind: str) -> _Handle:
        existing = self.handles.get(descriptor.name)
        if existing is not None:
            old = existing.descriptor
            if old.signature() != descriptor.signature() or (old.ttl_config is None) != (
                descriptor.ttl_config is None
            ):
                raise KeyedStateError(
                    f"state '{descriptor.name}' is already registered as {old!r}"
                    f"{' with TTL' if old.ttl_config else ''}; cannot register it again as "
                    f"{descriptor!r}{' with TTL' if descriptor.ttl_config else ''}"
                )
            return existing
        handle = create_handle(self, descriptor, kind)
        self.handles[descriptor.name] = handle
        if descriptor.ttl_config is not None:
            self._plans[descriptor.name] = _CleanupPlan(handle)
        if self.bucket_id >= 0:
            self._check_schema(descriptor.name)
        return handle

    def _signature(self, name: str) -> tuple[str, str, bool]:
        descriptor = self.handles[name].descriptor
        kind, spark_type = descriptor.signature()
        return (kind, spark_type, descriptor.ttl_config is not None)

    def _check_schema(self, name: str) -> None:
        stored = self._schema.get(name)
        if stored is None:
            return
        current = self._signature(name)
        if tuple(stored) != current:
            raise KeyedStateError(
                f"state '{name}' was stored as {stored[0]} state of {stored[1]}"
                f"{' with TTL' if stored[2] else ' without TTL'} and is now declared as "
                f"{current[0]} state of {current[1]}{' with TTL' if current[2] else ' without TTL'}"
                "; a state's kind, type and TTL cannot change on an existing checkpoint"
                " (use a new state name)"
            )

    # -----------------------------------------------------------------------------------------
    # One invocation

    def begin(
        self, bucket_id: int, num_buckets: int, blob: bytes | None, now: int, watermark: int
    ) -> None:
        self.bucket_id = bucket_id
        self.num_buckets = num_buckets
        self.now = now
        self.watermark = watermark
        self._records = {}
        self.records_processed = 0
        self.timers_changed = False
        self.cur = {}
        self.cur_key = None
        if blob is None:
            self.restored = False
            self._blobs = {}
            self.ptimers = {}
            self.etimers = {}
            self._exp = {}
            self.op_state = {}
            self._schema = {}
            return
        stored = pickle.loads(blob)
        if stored.get("format") != FORMAT_VERSION:
            raise KeyedStateError(
                f"bucket {bucket_id} holds keyedstate format {stored.get('format')!r}; this "
                f"version reads format {FORMAT_VERSION}"
            )
        if stored["buckets"] != num_buckets:
            raise KeyedStateError(
                f"this checkpoint was written with buckets={stored['buckets']}, the query now "
                f"uses buckets={num_buckets}; the number of buckets of a checkpoint cannot change "
                "(pass the old value to key_by(..., buckets=...) or start a new checkpoint)"
            )
        self.restored = True
        self._blobs = stored["keys"]
        self.ptimers = stored["pt"]
        self.etimers = stored["et"]
        self._exp = stored["exp"]
        self.op_state = stored["op"]
        self._schema = stored["schema"]
        for name in self.handles:
            self._check_schema(name)

    def set_current_key(self, key: Any) -> None:  # noqa: ANN401 - any key
        record = self._records.get(key)
        if record is None:
            blob = self._blobs.get(key)
            record = {} if blob is None else pickle.loads(blob)
            self._records[key] = record
        self.cur = record
        self.cur_key = key

    def load(self, key: Any) -> dict[str, Any]:  # noqa: ANN401
        self.set_current_key(key)
        return self.cur

    # -----------------------------------------------------------------------------------------
    # Timers

    def register_timer(self, domain_event: bool, timestamp: int) -> None:
        timers = self.etimers if domain_event else self.ptimers
        entry = (timestamp, self.cur_key)
        if entry not in timers:
            timers[entry] = None
            self.timers_changed = True

    def delete_timer(self, domain_event: bool, timestamp: int) -> None:
        timers = self.etimers if domain_event else self.ptimers
        if timers.pop((timestamp, self.cur_key), 0) is None:
            self.timers_changed = True

    def due_timers(self) -> tuple[bool, list[tuple[int, Any]]]:
        """Timers due now: event-time ones (timestamp <= watermark) first, then processing-time
        ones (timestamp <= now), each sorted by timestamp (ties in registration order)."""
        if self.etimers:
            watermark = self.watermark
            due = [entry for entry in self.etimers if entry[0] <= watermark]
            if due:
                due.sort(key=_timestamp)
                return True, due
        if self.ptimers:
            now = self.now
            due = [entry for entry in self.ptimers if entry[0] <= now]
            if due:
                due.sort(key=_timestamp)
                return False, due
        return False, []

    def take_timer(self, domain_event: bool, entry: tuple[int, Any]) -> bool:
        """Removes a due timer before it fires; False if an earlier timer deleted it."""
        timers = self.etimers if domain_event else self.ptimers
        if entry in timers:
            del timers[entry]
            self.timers_changed = True
            return True
        return False

    def next_processing_timer(self) -> int | None:
        return min(t for t, _ in self.ptimers) if self.ptimers else None

    def next_event_timer(self) -> int | None:
        return min(t for t, _ in self.etimers) if self.etimers else None

    def next_ttl_wakeup(self) -> int | None:
        """The earliest expiration among states whose cleanup runs without access."""
        times = [
            min(index.values())
            for name, index in self._exp.items()
            if index and name in self._plans and self._plans[name].wakeup
        ]
        return min(times) if times else None

    # -----------------------------------------------------------------------------------------
    # TTL cleanup and write-back

    def _expired_keys(self, name: str) -> list[Any]:
        index = self._exp.get(name)
        if not index:
            return []
        now = self.now
        return [key for key, expiry in index.items() if expiry <= now]

    def _run_cleanup(self) -> None:
        for name, plan in self._plans.items():
            if plan.all_expired_on_write:
                keys: Iterable[Any] = self._expired_keys(name)
            elif plan.incremental:
                budget = plan.incremental * (
                    max(1, self.records_processed) if plan.per_record else 1
                )
                index = self._exp.get(name, {})
                expired = sorted(self._expired_keys(name), key=index.__getitem__)
                keys = expired[:budget]
            else:
                continue
            for key in keys:
                if key not in self._records:
                    self.load(key)

    def finish(self) -> bytes | None:
        """Writes back the records of this invocation; the bucket's new stored state, or None
        when the bucket holds nothing any more."""
        if self._plans:
            self._run_cleanup()
        now = self.now
        plans = self._plans
        handles = self.handles
        blobs = self._blobs
        exp = self._exp
        dumps = pickle.dumps
        for key, record in self._records.items():
            if record and plans:
                for name, plan in plans.items():
                    stored = record.get(name)
                    if stored is None:
                        exp.get(name, {}).pop(key, None)
                        continue
                    handle = handles[name]
                    if plan.purge_on_write:
                        stored = handle.purge(stored, now)
                        if stored is None:
                            del record[name]
                            exp.get(name, {}).pop(key, None)
                            continue
                        record[name] = stored
                    expiry = handle.expiry(stored)
                    exp.setdefault(name, {})[key] = expiry
            elif plans:
                for name in plans:
                    index = exp.get(name)
                    if index:
                        index.pop(key, None)
            if record:
                blobs[key] = dumps(record, _PROTOCOL)
            else:
                blobs.pop(key, None)
        self._records = {}
        self.cur = {}
        for name in handles:
            self._schema[name] = self._signature(name)
        if not blobs and not self.ptimers and not self.etimers and not self.op_state:
            return None
        for name in [n for n, index in exp.items() if not index]:
            del exp[name]
        return dumps(
            {
                "format": FORMAT_VERSION,
                "buckets": self.num_buckets,
                "keys": blobs,
                "pt": self.ptimers,
                "et": self.etimers,
                "exp": exp,
                "op": self.op_state,
                "schema": self._schema,
            },
            _PROTOCOL,
        )

    # -----------------------------------------------------------------------------------------
    # Introspection (tests, the state reader)

    def stored_keys(self) -> list[Any]:
        return list(self._blobs)


def _timestamp(entry: tuple[int, Any]) -> int:
    return entry[0]


def decode_bucket(blob: bytes) -> dict[str, Any]:
    """The stored state of one bucket with every key's record unpickled (for inspection)."""
    stored = pickle.loads(blob)
    stored["keys"] = {key: pickle.loads(record) for key, record in stored["keys"].items()}
    return stored
