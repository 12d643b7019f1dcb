"""Values between Arrow (what Spark's ``mapInArrow`` carries) and the Python forms of the API.

A declared state type (:class:`TypeInformation`) or a Spark column type gets a *decoder* (the
Python value of an Arrow ``to_pylist()`` value) and an *encoder* (the value ``pyarrow.array``
takes for it). Both are ``None`` where the forms already agree (numbers, strings, bytes, ...),
so the common columns cost nothing per value.
"""

from __future__ import annotations

import datetime as dt
import pickle
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

from pyspark.sql import Row
from pyspark.sql import types as T

from keyedstate.state.types import TypeInformation, row_class

__all__ = ["Codec", "column_codec", "column_decoder", "state_codec"]

Convert = Callable[[Any], Any]


class Codec:
    """The decoder and encoder of one declared type (either may be None: identity)."""

    __slots__ = ("decode", "encode")

    def __init__(self, decode: Convert | None, encode: Convert | None) -> None:
        self.decode = decode
        self.encode = encode


def _naive(tz: dt.tzinfo) -> Convert:
    def decode(value: dt.datetime) -> dt.datetime:
        if value.tzinfo is None:
            return value
        return value.astimezone(tz).replace(tzinfo=None)

    return decode


def _aware(tz: dt.tzinfo) -> Convert:
    def encode(value: dt.datetime) -> dt.datetime:
        return value.replace(tzinfo=tz) if value.tzinfo is None else value

    return encode


def _nullable(convert: Convert | None) -> Convert | None:
    if convert is None:
        return None

    def inner(value: Any) -> Any:  # noqa: ANN401
        return None if value is None else convert(value)

    return inner


def _list(element: Convert | None) -> Convert | None:
    if element is None:
        return None
    element = _nullable(element)
    return lambda values: [element(v) for v in values]  # type: ignore[misc]


def state_codec(info: TypeInformation, time_zone: str) -> Codec:
    """The codec of a declared state type (values never None at the top level)."""
    tz = ZoneInfo(time_zone)
    name = info._name
    if info.is_pickled():
        return Codec(pickle.loads, lambda v: pickle.dumps(v, protocol=5))
    if name == "SQL_TIMESTAMP":
        return Codec(_naive(tz), _aware(tz))
    if name == "LIST":
        inner = state_codec(info.children[0], time_zone)
        return Codec(_list(inner.decode), _list(inner.encode))
    if name == "MAP":
        key = state_codec(info.children[0], time_zone)
        value = state_codec(info.children[1], time_zone)
        kd, vd = _nullable(key.decode), _nullable(value.decode)
        ke, ve = _nullable(key.encode), _nullable(value.encode)

        def decode_map(pairs: Any) -> dict:  # noqa: ANN401
            if kd is None and vd is None:
                return dict(pairs)
            return {(k if kd is None else kd(k)): (v if vd is None else vd(v)) for k, v in pairs}

        def encode_map(mapping: dict) -> list:
            return [
                (k if ke is None else ke(k), v if ve is None else ve(v)) for k, v in mapping.items()
            ]

        return Codec(decode_map, encode_map)
    if name in ("TUPLE", "ROW_NAMED"):
        spark = info.spark_type()
        assert isinstance(spark, T.StructType)
        names = spark.names
        fields = [state_codec(c, time_zone) for c in info.children]
        decoders = [_nullable(f.decode) for f in fields]
        encoders = [_nullable(f.encode) for f in fields]
        # A ROW_NAMED value is a Row whose fields win over tuple's methods (types.row_class).
        cls = row_class(tuple(names)) if name == "ROW_NAMED" else tuple

        def decode_struct(value: dict) -> Any:  # noqa: ANN401
            values = [
                value[n] if d is None else d(value[n]) for n, d in zip(names, decoders, strict=True)
            ]
            return tuple.__new__(cls, values)

        def encode_struct(value: Any) -> tuple:  # noqa: ANN401
            return tuple(v if e is None else e(v) for v, e in zip(value, encoders, strict=True))

        # pyarrow takes a tuple (a Row is one) for a struct, fields in order: no work per value
        # unless a field needs encoding.
        return Codec(decode_struct, None if all(e is None for e in encoders) else encode_struct)
    return Codec(None, None)


def column_decoder(data_type: T.DataType, time_zone: str) -> Convert | None:
    """How an input column's Arrow values become element values: ``datetime`` (naive, in the
    session time zone) for timestamps, dicts for maps and structs, lists for arrays."""
    return column_codec(data_type, time_zone).decode


def column_encoder(data_type: T.DataType, time_zone: str) -> Convert | None:
    """How an output value becomes what ``pyarrow.array`` takes for its Spark column type."""
    return column_codec(data_type, time_zone).encode


def column_codec(data_type: T.DataType, time_zone: str) -> Codec:
    """The decoder (``column_decoder``) and encoder (``column_encoder``) of a Spark column type,
    from one walk of the type."""
    tz = ZoneInfo(time_zone)
    if isinstance(data_type, T.TimestampType):
        return Codec(_naive(tz), _aware(tz))
    if isinstance(data_type, T.ArrayType):
        element = column_codec(data_type.elementType, time_zone)
        return Codec(_list(element.decode), _list(element.encode))
    if isinstance(data_type, T.MapType):
        key = column_codec(data_type.keyType, time_zone)
        value = column_codec(data_type.valueType, time_zone)
        kd, vd = _nullable(key.decode), _nullable(value.decode)
        ke, ve = _nullable(key.encode), _nullable(value.encode)

        def decode_map(pairs: Any) -> dict:  # noqa: ANN401
            return {(k if kd is None else kd(k)): (v if vd is None else vd(v)) for k, v in pairs}

        def encode_map(mapping: Any) -> list:  # noqa: ANN401
            return [
                (k if ke is None else ke(k), v if ve is None else ve(v))
                for k, v in (mapping.items() if isinstance(mapping, dict) else mapping)
            ]

        return Codec(decode_map, encode_map)
    if isinstance(data_type, T.StructType):
        names = data_type.names
        fields = [column_codec(f.dataType, time_zone) for f in data_type.fields]
        decoders = [_nullable(f.decode) for f in fields]
        encoders = [_nullable(f.encode) for f in fields]
        named_decoders = list(zip(names, decoders, strict=True))

        def decode_struct(value: Any) -> dict:  # noqa: ANN401
            return {n: value[n] if d is None else d(value[n]) for n, d in named_decoders}

        def encode_struct(value: Any) -> dict:  # noqa: ANN401
            if isinstance(value, dict):
                items = [value.get(n) for n in names]
            elif isinstance(value, Row) and hasattr(value, "__fields__"):
                items = [value[n] for n in names]
            else:
                items = list(value)
            return {
                n: v if e is None else e(v) for n, v, e in zip(names, items, encoders, strict=True)
            }

        # pyarrow takes tuples, Rows and dicts by field name as they are: no work per value
        # unless a field needs converting.
        return Codec(
            None if all(d is None for d in decoders) else decode_struct,
            None if all(e is None for e in encoders) else encode_struct,
        )
    return Codec(None, None)
