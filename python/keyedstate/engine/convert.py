"""Rows between pandas (what applyInPandasWithState carries) and plain Python values.

Input columns become Python lists (nulls as None, timestamps as ``datetime``, arrays as lists,
structs as dicts); each element is a named tuple of the input columns. Outputs are tuples (or
dicts, or single values) checked against the output schema column by column and turned into a
typed pandas DataFrame, so a wrong value fails with the column's name instead of an Arrow error.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import types as T

from keyedstate.state.types import StateTypeError

__all__ = ["InputConverter", "OutputBuilder", "element_class"]

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FLOATING = (T.FloatType, T.DoubleType)


# ---------------------------------------------------------------------------------------------
# Elements


def _rebuild_element(names: tuple[str, ...], values: tuple) -> tuple:
    return element_class(names)._make(values)


@lru_cache(maxsize=256)
def element_class(names: tuple[str, ...]) -> type:
    """A named tuple class for rows with these column names.

    ``value.user_id``, ``value[0]`` and ``value["user_id"]`` all work; ``as_dict()`` gives a
    dict. Instances pickle by column names, so elements can be kept in state.
    """
    base = namedtuple("Element", names, rename=True)  # type: ignore[misc]
    attribute = dict(zip(names, base._fields, strict=True))

    class Element(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __getitem__(self, item: Any) -> Any:  # noqa: ANN401
            if isinstance(item, str):
                try:
                    return getattr(self, attribute[item])
                except KeyError:
                    raise KeyError(f"no column {item!r}; columns are {list(names)}") from None
            return tuple.__getitem__(self, item)

        def as_dict(self) -> dict[str, Any]:
            return dict(zip(names, self, strict=True))

        asDict = as_dict  # noqa: N815 - pyspark Row's spelling

        def __reduce__(self) -> tuple:
            return (_rebuild_element, (names, tuple(self)))

        def __repr__(self) -> str:
            inner = ", ".join(f"{n}={v!r}" for n, v in zip(names, self, strict=True))
            return f"Element({inner})"

    return Element


# ---------------------------------------------------------------------------------------------
# Input: pandas column -> Python list


def _arrow_values(series: pd.Series) -> list | None:
    """The values of an Arrow-backed column (pandas' default for strings since 3.0) as Python
    objects with None for nulls, or None when the column is not Arrow-backed."""
    chunked = getattr(series.array, "_pa_array", None)
    return None if chunked is None else chunked.to_pylist()


def _with_nulls(series: pd.Series, values: list) -> list:
    array = series.to_numpy() if series.dtype.kind != "O" else series.array
    if series.dtype.kind in "biu":
        return values
    if series.dtype.kind == "f":
        if not np.isnan(array).any():
            return values
        return [None if v != v else v for v in values]
    mask = pd.isna(series).tolist()
    if True in mask:
        return [None if m else v for v, m in zip(values, mask, strict=True)]
    return values


def _integral_list(series: pd.Series) -> list:
    if series.dtype.kind in "iu":
        return series.tolist()
    values = _arrow_values(series)
    if values is not None:
        return values
    values = series.tolist()
    mask = series.isna().tolist()
    return [None if m else int(v) for v, m in zip(values, mask, strict=True)]


def _plain_list(series: pd.Series) -> list:
    values = _arrow_values(series)
    if values is not None:
        return values
    return _with_nulls(series, series.tolist())


def _timestamp_list(series: pd.Series) -> list:
    if series.dtype.kind == "M" or isinstance(series.dtype, pd.DatetimeTZDtype):
        values = list(series.dt.to_pydatetime())
        if series.isna().any():
            mask = series.isna().tolist()
            return [None if m else v for v, m in zip(values, mask, strict=True)]
        return values
    return _plain_list(series)


def _deep(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, np.ndarray):
        return [_deep(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, list):
        return [_deep(v) for v in value]
    if isinstance(value, dict):
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    return value


def _nested_list(series: pd.Series) -> list:
    values = _plain_list(series)
    return [None if v is None else _deep(v) for v in values]


def _map_list(series: pd.Series) -> list:
    out = []
    for v in _nested_list(series):
        if isinstance(v, list):
            v = {k: val for k, val in v}
        out.append(v)
    return out


def column_reader(data_type: T.DataType) -> Callable[[pd.Series], list]:
    if isinstance(data_type, _INTEGRAL):
        return _integral_list
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return _timestamp_list
    if isinstance(data_type, T.MapType):
        return _map_list
    if isinstance(data_type, T.ArrayType | T.StructType):
        return _nested_list
    return _plain_list


def timestamp_millis(series: pd.Series, time_zone: str) -> list:
    """Epoch milliseconds of a timestamp column delivered as session-local naive datetimes."""
    if series.dtype.kind != "M" and not isinstance(series.dtype, pd.DatetimeTZDtype):
        series = pd.to_datetime(series)
    if getattr(series.dt, "tz", None) is None:
        series = series.dt.tz_localize(time_zone, ambiguous=False, nonexistent="shift_forward")
    delta = series - pd.Timestamp(0, tz="UTC")
    millis = delta // pd.Timedelta(milliseconds=1)
    if millis.hasnans:
        mask = millis.isna().tolist()
        return [None if m else int(v) for v, m in zip(millis.tolist(), mask, strict=True)]
    return millis.astype("int64").tolist()


class InputConverter:
    """Turns one pandas chunk of the input into keys, elements and (optionally) event times."""

    def __init__(
        self,
        schema: T.StructType,
        key_columns: Sequence[str],
        event_time_column: str | None,
        time_zone: str,
    ) -> None:
        self.names = tuple(schema.names)
        self._readers = [column_reader(f.dataType) for f in schema.fields]
        self._key_positions = [self.names.index(c) for c in key_columns]
        self._event_time = (
            None if event_time_column is None else self.names.index(event_time_column)
        )
        self._time_zone = time_zone

    def convert(self, pdf: pd.DataFrame) -> tuple[list, list, list | None]:
        if len(pdf) == 0:
            return [], [], None
        # The input columns come first, in order (the bucket column follows them).
        columns = [
            read(series) for read, (_, series) in zip(self._readers, pdf.items(), strict=False)
        ]
        elements = list(map(element_class(self.names)._make, zip(*columns, strict=True)))
        if len(self._key_positions) == 1:
            keys = columns[self._key_positions[0]]
        else:
            keys = list(zip(*(columns[i] for i in self._key_positions), strict=True))
        times = None
        if self._event_time is not None:
            times = timestamp_millis(pdf.iloc[:, self._event_time], self._time_zone)
        return keys, elements, times


# ---------------------------------------------------------------------------------------------
# Output: Python values -> typed pandas DataFrame


_NP_INTS = (np.integer,)
_NP_FLOATS = (np.floating, np.integer)


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
    return None  # nested types: Spark's conversion checks them


class OutputBuilder:
    """Builds the pandas DataFrame of one invocation's outputs for the output schema."""

    def __init__(self, schema: T.StructType) -> None:
        self.schema = schema
        self.names = list(schema.names)
        self._width = len(self.names)
        self._allowed = [_allowed(f.dataType) for f in schema.fields]
        self._types = [f.dataType for f in schema.fields]

    def _row(self, value: Any) -> tuple:  # noqa: ANN401
        if isinstance(value, tuple):
            if len(value) == self._width:
                return value
            raise StateTypeError(
                f"an output has {len(value)} values, the output schema has {self._width} columns "
                f"{self.names}: {value!r}"
            )
        if isinstance(value, Mapping):
            missing = [n for n in self.names if n not in value]
            if missing:
                raise StateTypeError(f"an output dict lacks columns {missing}: {value!r}")
            return tuple(value[n] for n in self.names)
        if isinstance(value, list):
            return self._row(tuple(value))
        if self._width == 1:
            return (value,)
        raise StateTypeError(
            f"an output must be a tuple, a Row, a dict or (for one column) a value; the output "
            f"schema has columns {self.names}, got {type(value).__name__} {value!r}"
        )

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
            field = self.schema.fields[index]
            raise StateTypeError(
                f"output column '{field.name}' is {field.dataType.simpleString()}, got "
                f"{type(value).__name__} {value!r}"
            )

    def _column(self, index: int, column: Sequence[Any]) -> Any:  # noqa: ANN401
        data_type = self._types[index]
        has_null = None in column
        if isinstance(data_type, _INTEGRAL):
            if has_null:
                return pd.array(list(column), dtype="Int64")
            return np.fromiter(column, dtype=np.int64, count=len(column))
        if isinstance(data_type, _FLOATING):
            return np.array(column, dtype=np.float64)
        if isinstance(data_type, T.BooleanType):
            if has_null:
                return pd.array(list(column), dtype="boolean")
            return np.array(column, dtype=bool)
        if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
            return pd.to_datetime(pd.Series(column, dtype=object))
        return pd.Series(column, dtype=object)

    def build(self, outputs: list[Any]) -> pd.DataFrame:
        width = self._width
        rows = [
            o if type(o) is tuple and len(o) == width else self._row(o)  # noqa: E721
            for o in outputs
        ]
        columns = list(zip(*rows, strict=True))
        data = {}
        for i, name in enumerate(self.names):
            self._check(i, columns[i])
            data[name] = self._column(i, columns[i])
        return pd.DataFrame(data)
