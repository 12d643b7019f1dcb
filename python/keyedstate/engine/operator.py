"""The executor side: one call of ``applyInPandasWithState``'s function per bucket of keys.

Spark groups the input by ``pmod(hash(key columns), buckets)`` and calls
:meth:`BucketOperator.__call__` once per bucket that has input rows or a due timeout. The call
loads the bucket's stored state (one binary Spark state row), runs the user function on every
row in arrival order (or ``order_by`` order) switching the current key per row, fires due timers,
writes back the records of the keys it touched and sets the bucket's next Spark timeout to its
earliest timer. See docs/python-api.md ("Engine").
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import types as T
from pyspark.sql.streaming.state import GroupState

from keyedstate.engine.convert import InputConverter, OutputBuilder
from keyedstate.functions import (
    CheckpointedFunction,
    TimeDomain,
    _ContextImpl,
    _RuntimeContextImpl,
    _TimerServiceImpl,
)
from keyedstate.state.backend import MIN_TIME, KeyedStateBackend

__all__ = ["BucketOperator", "OperatorPlan", "STATE_SCHEMA"]

STATE_SCHEMA = T.StructType([T.StructField("keyedstate_bucket", T.BinaryType(), False)])

_NO_KEY = object()


@dataclass
class OperatorPlan:
    """Everything the executors need; pickled with the query."""

    kind: str  # "process", "map", "flat_map" or "filter"
    function: Any
    input_schema: T.StructType
    key_columns: list[str]
    output_schema: T.StructType
    num_buckets: int
    timer_mode: str  # "none", "event" or "processing"
    time_zone: str
    event_time_column: str | None = None
    order_by: str | None = None
    task_name: str = "keyedstate"


def _batch_id() -> int:
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            value = context.getLocalProperty("streaming.sql.batchId")
            if value is not None:
                return int(value)
    except Exception:  # noqa: BLE001 - outside a task or an older Spark
        pass
    return -1


class BucketOperator:
    """Runs the user function over the rows of one bucket; one instance per Spark task."""

    def __init__(self, plan: OperatorPlan) -> None:
        self.plan = plan
        self._ready = False

    def __getstate__(self) -> dict[str, Any]:
        return {"plan": self.plan}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.plan = state["plan"]
        self._ready = False

    # -----------------------------------------------------------------------------------------

    def _setup(self) -> None:
        plan = self.plan
        self._backend = KeyedStateBackend()
        self._timers = _TimerServiceImpl(self._backend, plan.timer_mode)
        self._ctx = _ContextImpl(self._backend, self._timers)
        self._runtime = _RuntimeContextImpl(self._backend, plan.num_buckets, plan.task_name)
        self._runtime.batch_id = _batch_id()  # one task runs one micro-batch
        self._input = InputConverter(
            plan.input_schema, plan.key_columns, plan.event_time_column, plan.time_zone
        )
        self._output = OutputBuilder(plan.output_schema)
        self._order_index = (
            None if plan.order_by is None else plan.input_schema.names.index(plan.order_by)
        )
        self._checkpointed = isinstance(plan.function, CheckpointedFunction)
        if self._checkpointed:
            # Each bucket is a parallel instance: it gets a fresh copy of the function.
            self._pristine = cloudpickle.dumps(plan.function)
        else:
            self._bind(plan.function)
            plan.function.open(self._runtime)
        self._ready = True

    def _bind(self, function: Any) -> None:  # noqa: ANN401
        self._function = function
        kind = self.plan.kind
        if kind == "process":
            self._element_fn = function.process_element
            self._on_timer = function.on_timer
        elif kind == "map":
            self._element_fn = function.map
            self._on_timer = None
        elif kind == "flat_map":
            self._element_fn = function.flat_map
            self._on_timer = None
        else:
            self._element_fn = function.filter
            self._on_timer = None

    def __call__(
        self, key: tuple, pdfs: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        if not self._ready:
            self._setup()
        plan = self.plan
        backend = self._backend
        now = state.getCurrentProcessingTimeMs()
        watermark_present = state._watermark_present
        watermark = state.getCurrentWatermarkMs() if watermark_present else MIN_TIME
        blob = state.get[0] if state.exists else None
        backend.begin(int(key[0]), plan.num_buckets, blob, now, watermark)
        if self._checkpointed:
            function = cloudpickle.loads(self._pristine)
            self._bind(function)
            function.open(self._runtime)
            function.initialize_state(self._runtime)

        out: list[Any] = []
        if self._on_timer is not None and (backend.etimers or backend.ptimers):
            self._fire(out)
        if self._order_index is None:
            for pdf in pdfs:
                keys, elements, times = self._input.convert(pdf)
                if keys:
                    self._run(keys, elements, times, out)
        else:
            self._run_ordered(pdfs, out)
        if self._on_timer is not None and (backend.etimers or backend.ptimers):
            self._fire(out)
        if self._checkpointed:
            self._function.snapshot_state(self._runtime)

        new_blob = backend.finish()
        if new_blob is None:
            if state.exists:
                state.remove()
        else:
            if new_blob != blob:
                state.update((new_blob,))
            self._set_timeout(state, now, watermark, watermark_present)
        if out:
            yield self._output.build(out)

    # -----------------------------------------------------------------------------------------

    def _set_timeout(self, state: GroupState, now: int, watermark: int, has_wm: bool) -> None:
        backend = self._backend
        mode = self.plan.timer_mode
        if mode == "processing":
            candidates = [backend.next_processing_timer(), backend.next_ttl_wakeup()]
            if backend.etimers and has_wm:
                candidates.append(now + 1)  # poll the watermark at the next batch
            wake = min((t for t in candidates if t is not None), default=None)
            if wake is not None:
                # Spark fires when timeout < batch time; a timer at t fires once batch time >= t.
                state.setTimeoutDuration(max(1, wake - 1 - now))
        elif mode == "event":
            wake = backend.next_event_timer()
            if wake is not None:
                floor = watermark if watermark > 0 else 1
                state.setTimeoutTimestamp(max(wake - 1, floor, 1))

    def _run(self, keys: list, elements: list, times: list | None, out: list) -> None:
        """Calls the function on every element, switching the current key as it changes.

        The key switch is inlined (it runs for nearly every row) and each kind of function has
        its own loop, so the per-row overhead is a few dictionary operations.
        """
        backend = self._backend
        records = backend._records
        blobs = backend._blobs
        loads = pickle.loads
        fn = self._element_fn
        kind = self.plan.kind
        ctx = self._ctx
        ctx.ts = None
        ctx.domain = TimeDomain.EVENT_TIME
        current: Any = _NO_KEY
        backend.records_processed += len(keys)
        append = out.append
        extend = out.extend
        timed = times is not None and kind == "process"
        for i, k in enumerate(keys):
            if k is not current and k != current:
                record = records.get(k)
                if record is None:
                    blob = blobs.get(k)
                    record = {} if blob is None else loads(blob)
                    records[k] = record
                backend.cur = record
                backend.cur_key = k
                current = k
            if kind == "process":
                if timed:
                    ctx.ts = times[i]  # type: ignore[index]
                result = fn(elements[i], ctx)
                if result is not None:
                    extend(result)
            elif kind == "map":
                append(fn(elements[i]))
            elif kind == "flat_map":
                result = fn(elements[i])
                if result is not None:
                    extend(result)
            elif fn(elements[i]):
                append(elements[i])

    def _run_ordered(self, pdfs: Iterator[pd.DataFrame], out: list) -> None:
        keys: list = []
        elements: list = []
        times: list | None = None
        for pdf in pdfs:
            k, e, t = self._input.convert(pdf)
            if not k:
                continue
            keys.extend(k)
            elements.extend(e)
            if t is not None:
                times = (times or []) + t
        if not keys:
            return
        index = self._order_index
        values = [e[index] for e in elements]
        if None in values:
            order = sorted(range(len(values)), key=lambda i: (values[i] is not None, values[i]))
        else:
            order = sorted(range(len(values)), key=values.__getitem__)
        self._run(
            [keys[i] for i in order],
            [elements[i] for i in order],
            None if times is None else [times[i] for i in order],
            out,
        )

    def _fire(self, out: list) -> None:
        backend = self._backend
        ctx = self._ctx
        on_timer = self._on_timer
        while True:
            event, due = backend.due_timers()
            if not due:
                return
            ctx.domain = TimeDomain.EVENT_TIME if event else TimeDomain.PROCESSING_TIME
            for entry in due:
                if not backend.take_timer(event, entry):
                    continue
                timestamp, key = entry
                backend.set_current_key(key)
                ctx.ts = timestamp
                result = on_timer(timestamp, ctx)
                if result is not None:
                    out.extend(result)
