"""Elements in, outputs and state changes out, as Arrow record batches.

Each element is a named tuple of the input columns. Outputs are tuples (or dicts, or single
values) checked against the output schema column by column, so a wrong value fails with the
column's name instead of an Arrow error; they leave with the key's state changes in one Arrow
schema (io.keyedstate.engine.Exchange.outSchema).
"""

from __future__ import annotations

import datetime as dt
import decimal
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from keyedstate.engine.codec import column_encoder
from keyedstate.state.types import StateTypeError

__all__ = ["OutputRows", "output_tuple"]

# Row kinds going back to the JVM (io.keyedstate.engine.Exchange; timer rows are the runner's).
OUTPUT, KEY_CHANGES, OPERATOR_STATES = range(3)

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FLOATING = (T.FloatType, T.DoubleType)

# pyspark 4.2+ labels timestamp fields with the session time zone; 4.0 and 4.1 label them UTC.
# The label only: the values are the same instants (microseconds since the epoch) either way.
_LABELS_TIME_ZONE = "timezone" in inspect.signature(to_arrow_schema).parameters


def _arrow_schema(schema: T.StructType, time_zone: str) -> pa.Schema:
    if _LABELS_TIME_ZONE:
        return to_arrow_schema(schema, timezone=time_zone)
    return to_arrow_schema(schema)


# ---------------------------------------------------------------------------------------------
# Outputs and state changes -> one Arrow record batch


def _allowed(data_type: T.DataType) -> tuple[type, ...] | None:
    if isinstance(data_type, _INTEGRAL):
        return (int, np.integer)
    if isinstance(data_type, _FLOATING):
        return (float, int, np.floating, np.integer)
    if isinstance(data_type, T.StringType):
        return (str,)
    if isinstance(data_type, T.BooleanType):
        return (bool, np.bool_)
    if isinstance(data_type, T.BinaryType):
        return (bytes, bytearray)
    if isinstance(data_type, T.DecimalType):
        return (decimal.Decimal, int)
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return (dt.datetime,)
    if isinstance(data_type, T.DateType):
        return (dt.date,)
    return None  # nested types: Arrow's conversion checks them


def output_tuple(value: Any, names: Sequence[str]) -> tuple:  # noqa: ANN401
    """An output as a tuple of one value per output column."""
    width = len(names)
    if isinstance(value, tuple):
        if len(value) == width:
            return value
        raise StateTypeError(
            f"an output has {len(value)} values, the output schema has {width} columns "
            f"{list(names)}: {value!r}"
        )
    if isinstance(value, Mapping):
        missing = [n for n in names if n not in value]
        if missing:
            raise StateTypeError(f"an output dict lacks columns {missing}: {value!r}")
        return tuple(value[n] for n in names)
    if isinstance(value, list):
        return output_tuple(tuple(value), names)
    if width == 1:
        return (value,)
    raise StateTypeError(
        f"an output must be a tuple, a Row, a dict or (for one column) a value; the output "
        f"schema has columns {list(names)}, got {type(value).__name__} {value!r}"
    )


def _side_label(name: str, sides: Sequence[Sequence[str]]) -> str:
    match = re.fullmatch(r"__ks_o(\d+)_(.*)", name)
    if match is None:
        return f"output column '{name}'"
    return f"side output {int(match.group(1))} column '{match.group(2)}'"


class OutputRows:
    """Collects one task's outputs and state changes and turns them into record batches.

    With side outputs, ``output_schema`` is the main output's columns, ``__ks_side`` (the side
    output's index, null for the main output) and each side output's columns: a main row is
    padded with nulls, a side row has nulls in every other output's columns.
    """

    def __init__(
        self,
        output_schema: T.StructType,
        exchange: T.StructType,
        time_zone: str,
        main_width: int | None = None,
        sides: Sequence[Sequence[str]] = (),
    ) -> None:
        all_names = tuple(output_schema.names)
        main = len(all_names) if main_width is None else main_width
        self.names = all_names[:main]
        self._width = main
        self._pad = (None,) * (len(all_names) - main)
        self._sides: list[tuple[tuple, tuple[str, ...], tuple]] = []
        offset = main + 1
        for j, names in enumerate(sides):
            prefix = (None,) * main + (j,) + (None,) * (offset - main - 1)
            suffix = (None,) * (len(all_names) - offset - len(names))
            self._sides.append((prefix, tuple(names), suffix))
            offset += len(names)
        self._fields = output_schema.fields
        self._labels = [_side_label(f.name, sides) for f in output_schema.fields]
        self._allowed = [_allowed(f.dataType) for f in output_schema.fields]
        self._encoders = [column_encoder(f.dataType, time_zone) for f in output_schema.fields]
        self._schema = _arrow_schema(exchange, time_zone)
        names = exchange.names
        self._key_columns = [i for i, n in enumerate(names) if re.fullmatch(r"__ks_k\d+", n)]
        self._key_encoders = [
            column_encoder(exchange[i].dataType, time_zone) for i in self._key_columns
        ]
        self._time = names.index("__ks_time")
        # A change row's cells after its key: per state variable its op, its data and (maps)
        # the removed map keys, in the exchange's column order (Exchange.outSchema).
        self._change_columns = [
            i for i, n in enumerate(names) if re.fullmatch(r"__ks_(op|s|rm)\d+", n)
        ]
        self._outputs: list[tuple] = []
        self._changes: list[list[Any]] = []  # key columns, then the change cells
        self._operator_states: list[Any] | None = None  # change cells, no key
        self._timers: list[tuple] = []  # (kind, key, timestamp)

    @property
    def size(self) -> int:
        pending = 0 if self._operator_states is None else 1
        return len(self._outputs) + len(self._changes) + len(self._timers) + pending

    @property
    def change_width(self) -> int:
        """How many cells a change row has after its key."""
        return len(self._change_columns)

    def change_cell(self, index: int) -> int:
        """Where state variable ``index``'s cells start in a change row (after its key): its
        op, then its data, then (maps) the removed map keys."""
        return self._change_columns.index(self._schema.get_field_index(f"__ks_op{index}"))

    def output(self, value: Any) -> None:  # noqa: ANN401
        if type(value) is tuple and len(value) == self._width:  # noqa: E721 - the fast path
            row = value
        else:
            row = output_tuple(value, self.names)
        self._outputs.append(row + self._pad if self._pad else row)

    def side(self, index: int, value: Any) -> None:  # noqa: ANN401
        prefix, names, suffix = self._sides[index]
        self._outputs.append(prefix + output_tuple(value, names) + suffix)

    def outputs(self, values: Any) -> None:  # noqa: ANN401
        for value in values:
            self.output(value)

    def change(self, row: list[Any]) -> None:
        """One key's state changes: its key columns, then ``change_width`` cells."""
        self._changes.append(row)

    def operator_states(self, cells: list[Any]) -> None:
        """The partition's operator list states: ``change_width`` cells."""
        self._operator_states = cells

    def timer(self, kind: int, key: tuple, timestamp: int) -> None:
        self._timers.append((kind, key, timestamp))

    def _check(self, index: int, column: Sequence[Any]) -> None:
        allowed = self._allowed[index]
        if allowed is None:
            return
        seen = set(map(type, column))
        seen.discard(type(None))
        bad = [
            t for t in seen if not issubclass(t, allowed) or (t is bool and allowed[0] is not bool)
        ]
        if bad:
            value = next(v for v in column if type(v) in bad)
            field = self._fields[index]
            raise StateTypeError(
                f"{self._labels[index]} is {field.dataType.simpleString()}, got "
                f"{type(value).__name__} {value!r}"
            )

    def _column(self, position: int, values: Sequence[Any]) -> pa.Array:
        arrow_field = self._schema.field(position)
        try:
            return pa.array(values, type=arrow_field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as error:
            raise StateTypeError(
                f"cannot convert column '{arrow_field.name}' to {arrow_field.type}: {error}"
            ) from None

    def _batch(self, rows: int, kinds: pa.Array, filled: dict[int, pa.Array]) -> pa.RecordBatch:
        """A batch of ``rows`` rows: the given columns, nulls (made by Arrow) elsewhere."""
        arrays = [kinds]
        for position in range(1, len(self._schema)):
            array = filled.get(position)
            arrays.append(
                array if array is not None else pa.nulls(rows, self._schema.field(position).type)
            )
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def _key_arrays(self, columns: Sequence[Sequence[Any]], filled: dict[int, pa.Array]) -> None:
        for position, encode, values in zip(
            self._key_columns, self._key_encoders, columns, strict=True
        ):
            if encode is not None:
                values = [None if v is None else encode(v) for v in values]
            filled[position] = self._column(position, values)

    def flush(self) -> list[pa.RecordBatch]:
        """The collected rows as record batches: one of outputs, one of key changes (a row per
        key), the operator states, one of timer changes; each dense in its own columns."""
        outputs, changes, timers = self._outputs, self._changes, self._timers
        self._outputs, self._changes, self._timers = [], [], []
        batches = []
        if outputs:
            filled: dict[int, pa.Array] = {}
            for j, values in enumerate(zip(*outputs, strict=True)):
                self._check(j, values)
                encode = self._encoders[j]
                if encode is not None:
                    values = tuple(None if v is None else encode(v) for v in values)
                filled[1 + j] = self._column(1 + j, values)
            kinds = pa.array(np.full(len(outputs), OUTPUT, dtype=np.int8))
            batches.append(self._batch(len(outputs), kinds, filled))
        if changes:
            columns = list(zip(*changes, strict=True))
            width = len(self._key_columns)
            filled = {}
            self._key_arrays(columns[:width], filled)
            for position, values in zip(self._change_columns, columns[width:], strict=True):
                filled[position] = self._column(position, values)
            kinds = pa.array(np.full(len(changes), KEY_CHANGES, dtype=np.int8))
            batches.append(self._batch(len(changes), kinds, filled))
        if self._operator_states is not None:
            cells, self._operator_states = self._operator_states, None
            filled = {
                p: self._column(p, [v]) for p, v in zip(self._change_columns, cells, strict=True)
            }
            batches.append(self._batch(1, pa.array([OPERATOR_STATES], type=pa.int8()), filled))
        if timers:
            filled = {}
            self._key_arrays(list(zip(*(t[1] for t in timers), strict=True)), filled)
            filled[self._time] = pa.array([t[2] for t in timers], type=pa.int64())
            kinds = pa.array([t[0] for t in timers], type=pa.int8())
            batches.append(self._batch(len(timers), kinds, filled))
        return batches
