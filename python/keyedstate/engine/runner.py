"""The executor side: the function Spark's ``mapInArrow`` runs for one state partition.

It reads the lookup node's rows (docs/python-api.md, "Engine"): a header with the batch's
times, the partition's operator state, then per key a row with the key's stored state, its due
timers and its input rows. Per key it fires due timers, runs the function on each element,
fires timers that became due, and writes the key's state changes after the outputs, in the
same Arrow stream; the apply node routes them into the store and commits it.
"""

from __future__ import annotations

import functools
import gc
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from keyedstate.elements import element_class
from keyedstate.engine.broadcast_maps import DECODED_MAPS, decoded_once
from keyedstate.engine.codec import column_decoder, state_codec
from keyedstate.engine.contexts import (
    BroadcastContextImpl,
    ContextImpl,
    RuntimeContextImpl,
    TimerServiceImpl,
    broadcast_views,
)
from keyedstate.engine.convert import OutputRows
from keyedstate.engine.function_copy import copy_function
from keyedstate.engine.keyed_state import MIN_TIME, KeyState
from keyedstate.functions import CheckpointedFunction, TimeDomain
from keyedstate.state.descriptors import (
    BROADCAST,
    OPERATOR_STATE_KINDS,
    StateDescriptor,
    StateUsageError,
)

__all__ = ["KeyedRunner", "RunnerPlan", "StatePlan"]

# Row kinds (io.keyedstate.engine.Exchange).
IN_BATCH, IN_KEY, IN_EVENT_TIMER, IN_PROC_TIMER, IN_ELEMENT, IN_OPERATOR_STATE = range(6)
IN_BROADCAST_ELEMENT = 6
IN_VISITED_KEY = 7  # a stored key and its state, for apply_to_keyed_state
REGISTER_EVENT, REGISTER_PROC, DELETE_EVENT, DELETE_PROC = range(5, 9)
# What a key's change row does to one state variable (its __ks_op<i> cell; None: unchanged).
PUT, APPEND, CLEAR = 1, 2, 3

OUTPUT_BATCH_ROWS = 8192


@dataclass
class StatePlan:
    """One declared state, as the runner moves it (index = its ``__ks_s<i>`` column)."""

    index: int
    name: str
    kind: str  # value, list, map, reducing, aggregating, operator_list, operator_union_list,
    # broadcast
    descriptor: StateDescriptor


@dataclass
class RunnerPlan:
    """Everything the executors need; pickled with the query."""

    kind: str  # "process", "map", "flat_map" or "filter"
    function: Any
    function_globals: dict[str, Any]
    input_schema: T.StructType
    key_columns: list[str]
    output_schema: T.StructType
    out_exchange: T.StructType
    states: list[StatePlan]
    timer_mode: str
    time_zone: str
    has_watermark: bool
    event_time_column: str | None = None
    task_name: str = "keyedstate"
    declared: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Side outputs: tag name -> index, each one's column names; the main output's width.
    side_tags: dict[str, int] = field(default_factory=dict)
    side_columns: list[list[str]] = field(default_factory=list)
    main_width: int | None = None
    # The broadcast stream's schema (a KeyedBroadcastProcessFunction), else None, and its
    # event-time column (the one its watermark is on), if it has one.
    broadcast_schema: T.StructType | None = None
    broadcast_event_time_column: str | None = None
    # Whether the function calls apply_to_keyed_state: the lookup sends every stored key first.
    visits_keyed_state: bool = False


def _refresh_globals(function: Any, snapshot: dict[str, Any]) -> None:  # noqa: ANN401
    """cloudpickle reuses a class it unpickled before in this Python worker (same class id), with
    the globals of that first query; put back the globals of this query's driver."""
    if not snapshot:
        return
    for cls in type(function).__mro__:
        for value in vars(cls).values():
            target = getattr(value, "__func__", value)
            globals_ = getattr(target, "__globals__", None)
            if isinstance(globals_, dict):
                for name in target.__code__.co_names:
                    if name in snapshot:
                        globals_[name] = snapshot[name]


class KeyedRunner:
    """``mapInArrow``'s function; one instance per query, state set up per task."""

    def __init__(self, plan: RunnerPlan) -> None:
        self.plan = plan

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # The clean-up is a with statement's, not a finally's: pyspark's worker prints each frame
        # of a failure's traceback at the line the frame is at when it reports (its simplified
        # traceback reads the frames, not the traceback), and a with statement puts this frame
        # back on the line that failed, where a finally leaves it on its last line.
        with _TaskScope(self.plan) as task:
            yield from task.run(batches)


class _TaskScope:
    """One task's set-up and clean-up: ``close()`` of the function, then the collector.

    The objects alive when the task starts (modules, Spark's and pyarrow's, the plan) are left
    out of cyclic garbage collection while it runs: the task allocates millions of small
    containers, and every full collection rescanned that whole heap (a fifth of the Python time
    of a large batch). What the task itself allocates is collected as usual."""

    def __init__(self, plan: RunnerPlan) -> None:
        self.plan = plan
        self.task: _Task | None = None

    def __enter__(self) -> _Task:
        gc.freeze()
        try:
            self.task = _Task(self.plan)
        except BaseException:
            gc.unfreeze()
            raise
        return self.task

    def __exit__(self, *_failure: object) -> None:
        try:
            if self.task is not None:
                self.task.close()
        finally:
            gc.unfreeze()


class _Task:
    def __init__(self, plan: RunnerPlan) -> None:
        self.plan = plan
        self.state = KeyState(plan.declared)
        self.function = copy_function(plan.function)
        _refresh_globals(self.function, plan.function_globals)
        self.runtime = RuntimeContextImpl(self.state, plan.task_name)
        self.runtime.batch_id = _batch_id()
        self.timers = TimerServiceImpl(self.state, plan.timer_mode)
        self.out = OutputRows(
            plan.output_schema,
            plan.out_exchange,
            plan.time_zone,
            plan.main_width,
            plan.side_columns,
        )
        self.change_at = {s.index: self.out.change_cell(s.index) for s in plan.states}
        self.no_changes = (None,) * self.out.change_width
        self.ctx = ContextImpl(self.state, self.timers, self._side if plan.side_tags else None)
        names = tuple(plan.input_schema.names)
        self.element_class = element_class(names)
        self.make_element = functools.partial(tuple.__new__, self.element_class)
        self.input_decoders = [
            column_decoder(f.dataType, plan.time_zone) for f in plan.input_schema.fields
        ]
        # The key columns of a row, as a tuple (itemgetter of several positions makes one).
        self.key_of = _key_getter([names.index(c) for c in plan.key_columns])
        self.event_time = (
            None if plan.event_time_column is None else names.index(plan.event_time_column)
        )
        self.codecs = {s.index: state_codec(_value_type(s), plan.time_zone) for s in plan.states}
        self.keyed = [
            s for s in plan.states if s.kind not in OPERATOR_STATE_KINDS and s.kind != BROADCAST
        ]
        self.broadcast_states = [s for s in plan.states if s.kind == BROADCAST]
        self.keyed_columns = [
            (s.name, s.index, self.codecs[s.index].decode, s.kind in ("list", "map"))
            for s in self.keyed
        ]
        self.map_codecs = {
            s.index: (
                state_codec(s.descriptor.key_type_info, plan.time_zone).encode,  # type: ignore[attr-defined]
                state_codec(s.descriptor.value_type_info, plan.time_zone).encode,  # type: ignore[attr-defined]
            )
            for s in [*self.keyed, *self.broadcast_states]
            if s.kind in ("map", BROADCAST)
        }
        # The partition's broadcast states: a state backend of their own, whose one "key" is the
        # partition (loaded from the operator-state row, written back with the operator states).
        self.broadcast = KeyState({s.name: s.descriptor.signature() for s in self.broadcast_states})
        read_only, writable = broadcast_views(
            self.broadcast,
            [s.descriptor for s in self.broadcast_states],  # type: ignore[misc]
        )
        self.ctx.broadcast = read_only
        self.broadcast_ctx = BroadcastContextImpl(
            self.state, writable, self._side if plan.side_tags else None, self._visit
        )
        # Every stored key's state, when the function visits them: by the key row made hashable,
        # the key row and its state values.
        self.visited: dict[Any, tuple[tuple, dict[str, Any]]] = {}
        self.broadcast_at: int | None = None
        self.broadcast_rows: list[Any] = []
        # Each broadcast element's event time in ms (ctx.timestamp()), by row, when its stream
        # has a watermark.
        self.broadcast_times: list[int | None] | None = None
        self.broadcast_event_time = (
            None
            if plan.broadcast_schema is None or plan.broadcast_event_time_column is None
            else plan.broadcast_schema.names.index(plan.broadcast_event_time_column)
        )
        if plan.broadcast_schema is not None:
            self.broadcast_decoders = [
                column_decoder(f.dataType, plan.time_zone) for f in plan.broadcast_schema.fields
            ]
            self.make_broadcast = functools.partial(
                tuple.__new__, element_class(tuple(plan.broadcast_schema.names))
            )
        self.op_states = [s for s in plan.states if s.kind in OPERATOR_STATE_KINDS]
        self.checkpointed = isinstance(self.function, CheckpointedFunction)
        self.opened = False
        self.closed = False
        kind = plan.kind
        fn = self.function
        self.element_fn = {
            "process": getattr(fn, "process_element", None),
            "map": getattr(fn, "map", None),
            "flat_map": getattr(fn, "flat_map", None),
            "filter": getattr(fn, "filter", None),
        }[kind]
        self.on_timer = fn.on_timer if kind == "process" else None
        self.positions: tuple[int, dict[int, int], list[int]] | None = None
        self.has_key = False
        self.pre_fired = True
        self.due: list[tuple[bool, int]] = []
        self.state_row = 0  # the next key (or visited key) row's index in the state columns

    def _side(self, tag: Any, value: Any) -> None:  # noqa: ANN401
        index = self.plan.side_tags.get(getattr(tag, "tag_id", tag))
        if index is None:
            raise StateUsageError(
                f"side output {getattr(tag, 'tag_id', tag)!r} was not declared; process() "
                f"declares {sorted(self.plan.side_tags)}"
            )
        self.out.side(index, value)

    # -----------------------------------------------------------------------------------------

    def _open(self) -> None:
        self.opened = True
        self.function.open(self.runtime)
        if self.checkpointed:
            self.function.initialize_state(self.runtime)

    def close(self) -> None:
        if self.opened and not self.closed:
            self.closed = True
            self.function.close()

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out = self.out
        for batch in batches:
            if batch.num_rows == 0:
                continue
            self._batch(batch)
            if out.size >= OUTPUT_BATCH_ROWS:
                yield from out.flush()
        if self.opened:
            self._end_key()
            if self.checkpointed:
                self.function.snapshot_state(self.runtime)
            cells: list[Any] = [None] * out.change_width
            for s in self.op_states:
                values = self.state.op_state.get(s.name)
                if values is not None:
                    encode = self.codecs[s.index].encode
                    at = self.change_at[s.index]
                    cells[at] = PUT
                    cells[at + 1] = values if encode is None else encode(values)
            broadcast = self.broadcast
            for s in self.broadcast_states:
                if s.name in broadcast.dirty:
                    self._map_change(cells, self.change_at[s.index], s, broadcast)
            if any(c is not None for c in cells):
                out.operator_states(cells)
        if out.size:
            yield from out.flush()

    def _batch(self, batch: pa.RecordBatch) -> None:
        plan = self.plan
        if self.positions is None:
            # Where each column is, from the schema the JVM sent (Exchange.inSchema owns it).
            names = batch.schema.names
            self.positions = (
                names.index(plan.input_schema.names[0]) if plan.input_schema.names else 0,
                {s.index: names.index(f"__ks_s{s.index}") for s in plan.states},
                [names.index(n) for n in ("__ks_time", "__ks_wm", "__ks_parts")],
            )
            if plan.broadcast_schema is not None:
                self.broadcast_at = names.index("__ks_b0")
        offset, state_position, (time_at, _, _) = self.positions
        kinds = batch.column(0).to_pylist()
        width = len(plan.input_schema.fields)
        has_keys = IN_KEY in kinds
        columns = _decoded_columns(batch, offset, self.input_decoders)
        # Every row as an element (key rows too: their key columns are read from it).
        # tuple.__new__ makes each named tuple in C (its _make is a Python call per row).
        make = self.make_element
        rows = list(map(make, zip(*columns, strict=True))) if width else [make(())] * len(kinds)
        times = batch.column(time_at).to_pylist()
        event_ms = None
        if self.event_time is not None and IN_ELEMENT in kinds:
            event_ms = _millis(batch.column(offset + self.event_time))
        if self.broadcast_at is not None and IN_BROADCAST_ELEMENT in kinds:
            decoded = _decoded_columns(batch, self.broadcast_at, self.broadcast_decoders)
            self.broadcast_rows = list(map(self.make_broadcast, zip(*decoded, strict=True)))
            if self.broadcast_event_time is not None:
                column = batch.column(self.broadcast_at + self.broadcast_event_time)
                self.broadcast_times = _millis(column)
        # Stored keyed state comes on key rows (and visited-key rows) only: just their cells
        # become Python values, in row order (``_control`` takes them one by one). The operator
        # state row's cells are read where they are (a large broadcast map is not converted
        # with every row's empty one).
        state_columns: dict[int, list[Any]] = {}
        self.state_row = 0
        visits = plan.visits_keyed_state and IN_VISITED_KEY in kinds
        if self.keyed and (has_keys or visits):
            kind_column = batch.column(0)
            carrying = pc.equal(kind_column, IN_KEY)
            if visits:
                carrying = pc.or_(carrying, pc.equal(kind_column, IN_VISITED_KEY))
            carriers = pc.indices_nonzero(carrying)
            for s in self.keyed:
                column = batch.column(state_position[s.index])
                state_columns[s.index] = column.take(carriers).to_pylist()

        element_fn = self.element_fn
        kind = plan.kind
        ctx = self.ctx
        ctx.domain = TimeDomain.EVENT_TIME
        ctx.ts = None
        out = self.out
        output = out.output
        collected = out._outputs.append
        width = out._width
        # The bulk: process_element returning tuples of the output's width, no event time.
        plain = kind == "process" and event_ms is None and not out._pad
        pre_fired = self.pre_fired
        for i, k in enumerate(kinds):
            if k != IN_ELEMENT:
                self._control(i, k, rows, times, state_columns, batch)
                pre_fired = self.pre_fired
                continue
            if not pre_fired:
                self._fire_due()
                pre_fired = True
                ctx.domain = TimeDomain.EVENT_TIME
            element = rows[i]
            if plain:
                result = element_fn(element, ctx)
                if result is not None:
                    for value in result:
                        if type(value) is tuple and len(value) == width:  # noqa: E721
                            collected(value)
                        else:
                            output(value)
            elif kind == "process":
                if event_ms is not None:
                    ctx.ts = event_ms[i]
                result = element_fn(element, ctx)
                if result is not None:
                    for value in result:
                        output(value)
            elif kind == "map":
                output(element_fn(element))
            elif kind == "flat_map":
                result = element_fn(element)
                if result is not None:
                    for value in result:
                        output(value)
            elif element_fn(element):
                output(element)
        if not self.opened and IN_BATCH in kinds:
            self._open()

    def _control(
        self,
        i: int,
        k: int,
        rows: list[Any],
        times: list[Any],
        state_columns: dict[int, list[Any]],
        batch: pa.RecordBatch,
    ) -> None:
        """A row that is not an element: a key (its state), a due timer, the batch header or
        the operator state."""
        if k == IN_KEY:
            self._end_key()
            j = self.state_row
            self.state_row = j + 1
            key_row = self.key_of(rows[i])
            # A key visited by apply_to_keyed_state has its state as the visits left it.
            visited = self.visited.get(_hashable(key_row)) if self.visited else None
            values = visited[1] if visited is not None else None
            if values is None:
                values = self._stored_values(state_columns, j)
            self.state.load(key_row[0] if len(key_row) == 1 else key_row, values)
            self.current_key_row = key_row
            self.has_key = True
            self.pre_fired = False
            self.due = []
        elif k == IN_EVENT_TIMER:
            self.due.append((True, times[i]))
        elif k == IN_PROC_TIMER:
            self.due.append((False, times[i]))
        elif k == IN_BATCH:
            assert self.positions is not None
            _, _, (_, watermark_at, partitions_at) = self.positions
            state = self.state
            state.now = times[i]
            watermark = batch.column(watermark_at)[i].as_py()
            state.watermark = watermark if self.plan.has_watermark else MIN_TIME
            state.partition = _partition_id()
            state.num_partitions = batch.column(partitions_at)[i].as_py()
        elif k == IN_OPERATOR_STATE:
            assert self.positions is not None
            at = self.positions[1]
            for s in self.op_states:
                stored = batch.column(at[s.index])[i].as_py()
                if stored:
                    decode = self.codecs[s.index].decode
                    self.state.op_state[s.name] = stored if decode is None else decode(stored)
                    self.state.restored = True
            if self.broadcast_states:
                maps: dict[str, Any] = {}
                for s in self.broadcast_states:
                    cell = batch.column(at[s.index])[i]
                    if cell.is_valid and len(cell):
                        maps[s.name] = self._broadcast_map(s, cell)
                self.broadcast.load(None, maps)
        elif k == IN_VISITED_KEY:
            j = self.state_row
            self.state_row = j + 1
            key_row = self.key_of(rows[i])
            self.visited[_hashable(key_row)] = (key_row, self._stored_values(state_columns, j))
        elif k == IN_BROADCAST_ELEMENT:
            # Every partition runs every broadcast element, in order, before its keys.
            if not self.opened:
                self._open()
            # Keyed state has no current key here (Flink refuses it too): only through
            # apply_to_keyed_state, which loads each visited key's own values.
            self.state.cur = _NO_CURRENT_KEY
            times = self.broadcast_times
            self.broadcast_ctx.ts = None if times is None else times[i]
            try:
                result = self.function.process_broadcast_element(
                    self.broadcast_rows[i], self.broadcast_ctx
                )
            finally:
                self.state.cur = {}
            if result is not None:
                self.out.outputs(result)
        if not self.opened and k != IN_BATCH and k != IN_OPERATOR_STATE:
            self._open()

    def _broadcast_map(self, s: StatePlan, cell: Any) -> dict:  # noqa: ANN401
        """A broadcast state as stored: decoded once per worker while it does not change,
        where its keys and values allow it (see broadcast_maps)."""
        decode = self.codecs[s.index].decode
        descriptor = s.descriptor
        if decoded_once(descriptor.key_type_info) and decoded_once(descriptor.value_type_info):  # type: ignore[attr-defined]
            key = (s.name, descriptor.signature(), self.plan.time_zone)
            return DECODED_MAPS.decode(key, cell, decode)
        return decode(cell.as_py())

    def _stored_values(self, state_columns: dict[int, list[Any]], j: int) -> dict[str, Any]:
        """The keyed states of the ``j``-th row carrying state, as Python values."""
        values: dict[str, Any] = {}
        for name, column, decode, nested in self.keyed_columns:
            stored = state_columns[column][j]
            # An absent list or map comes as empty (see KeyedStateLookupExec.emit).
            if stored is not None and (stored or not nested):
                values[name] = stored if decode is None else decode(stored)
        return values

    def _visit(self, descriptor: Any, function: Callable[[Any, Any], None]) -> None:  # noqa: ANN401
        """``apply_to_keyed_state``: ``function(key, state)`` for every stored key with that
        state (Flink's ``applyToKeyedState``); what it changes is written as the key's changes,
        and the key's elements later in the batch see it."""
        if not self.plan.visits_keyed_state:
            raise StateUsageError(
                "apply_to_keyed_state is called, but the function's code did not name it when "
                "the query was planned (keyedstate looks for it in the function's methods to "
                "send every key's state ahead): call it by name in the function's class"
            )
        handle = self.state.handles.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if handle is None or handle.descriptor.signature() != descriptor.signature():
            raise StateUsageError(
                f"apply_to_keyed_state: no keyed state {descriptor!r} was created in open(); "
                f"the function's keyed states are {sorted(self.state.handles)}"
            )
        state = self.state
        try:
            for key_row, values in self.visited.values():
                if descriptor.name not in values:
                    continue
                key = key_row[0] if len(key_row) == 1 else key_row
                state.load(key, values)  # the visit changes ``values`` in place
                function(key, handle)
                if state.dirty:
                    self.out.change(self._change_row(key_row))
        finally:
            state.load(None, _NO_CURRENT_KEY)

    # -----------------------------------------------------------------------------------------
    # Timers and the end of a key

    def _fire(self, event: bool, timestamp: int) -> None:
        state = self.state
        if state.timers.get((event, timestamp)) is False:
            return  # deleted before it fired
        state.timers[(event, timestamp)] = False
        ctx = self.ctx
        ctx.ts = timestamp
        ctx.domain = TimeDomain.EVENT_TIME if event else TimeDomain.PROCESSING_TIME
        result = self.on_timer(timestamp, ctx)  # type: ignore[misc]
        if result is not None:
            self.out.outputs(result)
        ctx.ts = None  # elements without an event time see None

    def _fire_due(self) -> None:
        """The key's timers due at the start of the batch: event time first, each by time."""
        self.pre_fired = True
        if not self.due or self.on_timer is None:
            return
        for event, timestamp in sorted(self.due, key=lambda t: (not t[0], t[1])):
            self._fire(event, timestamp)

    def _fire_new(self) -> None:
        """Timers registered in this batch for a time already passed fire at its end."""
        state = self.state
        while True:
            due = sorted(
                (
                    t
                    for t, registered in state.timers.items()
                    if registered and (t[1] <= state.watermark if t[0] else t[1] <= state.now)
                ),
                key=lambda t: (not t[0], t[1]),
            )
            if not due:
                return
            for event, timestamp in due:
                self._fire(event, timestamp)

    def _end_key(self) -> None:
        if not self.has_key:
            return
        self.has_key = False
        if not self.pre_fired:
            self._fire_due()
        state = self.state
        if self.on_timer is not None and state.timers:
            self._fire_new()
        key = self.current_key_row
        out = self.out
        if state.dirty:
            out.change(self._change_row(key))
        for (event, timestamp), registered in state.timers.items():
            kind = (
                (REGISTER_EVENT if event else REGISTER_PROC)
                if registered
                else (DELETE_EVENT if event else DELETE_PROC)
            )
            out.timer(kind, key, timestamp)

    def _change_row(self, key: tuple) -> list[Any]:
        """One row for all the current key's changes: its key, then per state variable an op
        and data."""
        state = self.state
        dirty = state.dirty
        row: list[Any] = [*key, *self.no_changes]
        base = len(key)
        for s in self.keyed:
            name = s.name
            if name not in dirty:
                continue
            at = base + self.change_at[s.index]
            encode = self.codecs[s.index].encode
            current = state.cur.get(name)
            if s.kind == "list":
                if name in state.replaced:
                    if current:
                        row[at] = PUT
                        row[at + 1] = _encode_all(current, encode)
                    else:
                        row[at] = CLEAR
                else:
                    appended = state.appended.get(name)
                    if appended:
                        row[at] = APPEND
                        row[at + 1] = _encode_all(appended, encode)
            elif s.kind == "map":
                self._map_change(row, at, s, state)
            elif current is None:
                row[at] = CLEAR
            else:
                row[at] = PUT
                row[at + 1] = current if encode is None else encode(current)
        return row

    def _map_change(self, row: list[Any], at: int, s: StatePlan, state: KeyState) -> None:
        """A map state's change cells (op, entries put, map keys removed) at ``at`` of ``row``."""
        name = s.name
        current = state.cur.get(name)
        key_codec, value_codec = self.map_codecs[s.index]
        if name in state.map_cleared:
            row[at] = CLEAR
            changed = current.keys() if current else ()
        else:
            row[at] = PUT
            changed = state.map_changes.get(name, ())
        puts = []
        removed = []
        for map_key in changed:
            encoded_key = map_key if key_codec is None else key_codec(map_key)
            if current is not None and map_key in current:
                value = current[map_key]
                if value is not None and value_codec is not None:
                    value = value_codec(value)
                puts.append((encoded_key, value))
            else:
                removed.append(encoded_key)
        row[at + 1] = puts
        row[at + 2] = removed


class _NoCurrentKey(dict):
    """The keyed state values while broadcast elements are processed: there is no current key."""

    def _refuse(self, *_: Any) -> Any:  # noqa: ANN401
        raise StateUsageError(
            "keyed state has no current key in process_broadcast_element: reach every key's "
            "state with ctx.apply_to_keyed_state(descriptor, function)"
        )

    get = __getitem__ = __setitem__ = __delitem__ = __contains__ = pop = setdefault = _refuse


_NO_CURRENT_KEY = _NoCurrentKey()


def _decoded_columns(batch: pa.RecordBatch, start: int, decoders: list[Any]) -> list[list[Any]]:
    """The columns from ``start`` on, one per decoder, as Python values."""
    columns = []
    for i, decode in enumerate(decoders):
        values = batch.column(start + i).to_pylist()
        if decode is not None:
            values = [None if v is None else decode(v) for v in values]
        columns.append(values)
    return columns


def _millis(column: pa.Array) -> list[int | None]:
    """An event-time (timestamp) column's values in ms since the epoch."""
    micros = pc.cast(column, pa.int64())
    return [None if v is None else v // 1000 for v in micros.to_pylist()]


def _hashable(value: Any) -> Any:  # noqa: ANN401
    """A key's values as a hashable form (struct keys come as dicts, arrays as lists)."""
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


def _key_getter(positions: list[int]) -> Callable[[tuple], tuple]:
    if len(positions) == 1:
        (position,) = positions
        return lambda row: (row[position],)
    return operator.itemgetter(*positions)


def _encode_all(values: list[Any], encode: Any) -> list[Any]:  # noqa: ANN401
    """``encode`` is the whole list's encoder (LIST codec)."""
    return values if encode is None else encode(values)


def _value_type(s: StatePlan) -> Any:  # noqa: ANN401
    """The declared type of a state's column: the value, the whole list or the whole map."""
    return s.descriptor.type_info


def _batch_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty("streaming.sql.batchId")
    return -1 if value is None else int(value)


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else context.partitionId()
