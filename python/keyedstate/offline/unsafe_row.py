"""Spark's ``UnsafeRow`` binary format, decoded in Python (no JVM): the rows keyedstate stores in
RocksDB, and the key encodings of Spark's state store key encoders (``NoPrefix``, ``PrefixKeyScan``,
``RangeKeyScan``) that ``rocks.ColumnFamilyCodec`` uses.

An ``UnsafeRow`` of ``n`` fields is a null bitset (``ceil(n / 64)`` little-endian 64-bit
words), then one 8-byte slot per field, then the variable-length data. A fixed-size value
(boolean, byte, short, int, long, float, double, date, timestamp, a decimal of precision 18 or
less as its unscaled long) sits in its slot, little-endian; a variable-length one (string,
binary, a larger decimal, a nested struct, array or map) has ``offset << 32 | size`` in its slot,
the offset from the row's start.
An array (``UnsafeArrayData``) is its element count (8 bytes), a null bitset, the elements at their
natural width (8 bytes for variable-length ones, which point into the array), padded to 8 bytes,
then their data; a map is the byte size of its key array (8 bytes), the key array, the value array.

Values decode to what pyspark's ``collect()`` gives, except timestamps: ``datetime`` in UTC
(timezone-aware), not naive local time; and binary is ``bytes``. Structs are pyspark ``Row``s.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct
from collections.abc import Callable
from typing import Any

from pyspark.sql import types as T

__all__ = [
    "UnsupportedTypeError",
    "key_decoder",
    "row_decoder",
    "schema_of",
]

# A reader of one value: (buffer, start of the row or array that holds it, position of its slot).
Reader = Callable[[bytes, int, int], Any]

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_MAX_LONG_DIGITS = 18  # Spark's Decimal.MAX_LONG_DIGITS: smaller decimals are stored as a long

_I8, _I16, _I32, _I64 = (struct.Struct(f) for f in ("<b", "<h", "<i", "<q"))
_F32, _F64 = struct.Struct("<f"), struct.Struct("<d")
_U64 = struct.Struct("<Q")

# Spark's state store: the version byte before each encoded row of a key, and the markers of a
# range-scan ordering column (RocksDBDataEncoder: negative, positive, null).
STATE_ENCODING_VERSION = 0
_NEGATIVE, _NULL = 0x00, 0x02


class UnsupportedTypeError(ValueError):
    """A stored type this decoder does not read (the message names it)."""


def schema_of(schema_json: str) -> T.StructType:
    """A manifest's key or value schema (Spark's JSON of a struct)."""
    return T.StructType.fromJson(json.loads(schema_json))


def _null_bits(buf: bytes, at: int, index: int) -> bool:
    word = _U64.unpack_from(buf, at + (index >> 6) * 8)[0]
    return bool(word >> (index & 63) & 1)


def _bitset_bytes(n: int) -> int:
    return ((n + 63) // 64) * 8


def _var(buf: bytes, pos: int) -> tuple[int, int]:
    """A variable-length value's (offset, size) from its slot."""
    word = _U64.unpack_from(buf, pos)[0]
    return word >> 32, word & 0xFFFFFFFF


def _fixed(fmt: struct.Struct, convert: Callable[[Any], Any] | None = None) -> Reader:
    unpack = fmt.unpack_from
    if convert is None:
        return lambda buf, base, pos: unpack(buf, pos)[0]
    return lambda buf, base, pos: convert(unpack(buf, pos)[0])


def _element_width(data_type: T.DataType) -> int:
    """The width of an array element of this type (Spark's UnsafeArrayWriter)."""
    if isinstance(data_type, T.BooleanType | T.ByteType):
        return 1
    if isinstance(data_type, T.ShortType):
        return 2
    if isinstance(data_type, T.IntegerType | T.FloatType | T.DateType | T.YearMonthIntervalType):
        return 4
    return 8


def value_reader(data_type: T.DataType) -> Reader:
    """A reader of one non-null value of ``data_type`` (its slot at ``pos``)."""
    if isinstance(data_type, T.BooleanType):
        return lambda buf, base, pos: buf[pos] != 0
    if isinstance(data_type, T.ByteType):
        return _fixed(_I8)
    if isinstance(data_type, T.ShortType):
        return _fixed(_I16)
    if isinstance(data_type, T.IntegerType | T.YearMonthIntervalType):
        return _fixed(_I32)
    if isinstance(data_type, T.LongType):
        return _fixed(_I64)
    if isinstance(data_type, T.FloatType):
        return _fixed(_F32)
    if isinstance(data_type, T.DoubleType):
        return _fixed(_F64)
    if isinstance(data_type, T.DateType):
        return _fixed(_I32, lambda days: _EPOCH_DATE + dt.timedelta(days=days))
    if isinstance(data_type, T.TimestampType):
        return _fixed(_I64, lambda us: _EPOCH_UTC + dt.timedelta(microseconds=us))
    if isinstance(data_type, T.TimestampNTZType):
        return _fixed(_I64, lambda us: _EPOCH_NAIVE + dt.timedelta(microseconds=us))
    if isinstance(data_type, T.DayTimeIntervalType):
        return _fixed(_I64, lambda us: dt.timedelta(microseconds=us))
    if isinstance(data_type, T.NullType):
        return lambda buf, base, pos: None
    if isinstance(data_type, T.DecimalType):
        scale = data_type.scale

        def exact(unscaled: int) -> decimal.Decimal:
            # From text: exact at any precision (arithmetic would round to the context's 28 digits).
            return decimal.Decimal(f"{unscaled}E-{scale}")

        if data_type.precision <= _MAX_LONG_DIGITS:
            return _fixed(_I64, exact)

        def big_decimal(buf: bytes, base: int, pos: int) -> decimal.Decimal:
            offset, size = _var(buf, pos)
            start = base + offset
            return exact(int.from_bytes(buf[start : start + size], "big", signed=True))

        return big_decimal
    if isinstance(data_type, T.StringType | T.CharType | T.VarcharType):

        def string(buf: bytes, base: int, pos: int) -> str:
            offset, size = _var(buf, pos)
            return bytes(buf[base + offset : base + offset + size]).decode("utf-8")

        return string
    if isinstance(data_type, T.BinaryType):

        def binary(buf: bytes, base: int, pos: int) -> bytes:
            offset, size = _var(buf, pos)
            return bytes(buf[base + offset : base + offset + size])

        return binary
    if isinstance(data_type, T.StructType):
        nested = row_decoder(data_type)

        def struct_value(buf: bytes, base: int, pos: int) -> T.Row:
            offset, size = _var(buf, pos)
            return nested(buf, base + offset, size)

        return struct_value
    if isinstance(data_type, T.ArrayType):
        array = _array_reader(data_type.elementType)

        def array_value(buf: bytes, base: int, pos: int) -> list[Any]:
            offset, _ = _var(buf, pos)
            return array(buf, base + offset)

        return array_value
    if isinstance(data_type, T.MapType):
        keys = _array_reader(data_type.keyType)
        values = _array_reader(data_type.valueType)

        def map_value(buf: bytes, base: int, pos: int) -> dict[Any, Any]:
            offset, _ = _var(buf, pos)
            start = base + offset
            key_bytes = _I64.unpack_from(buf, start)[0]
            found_keys = keys(buf, start + 8)
            found_values = values(buf, start + 8 + key_bytes)
            return dict(zip(found_keys, found_values, strict=True))

        return map_value
    raise UnsupportedTypeError(
        f"stored values of type {data_type.simpleString()} are not decoded by the local reader"
    )


def _array_reader(element_type: T.DataType) -> Callable[[bytes, int], list[Any]]:
    read = value_reader(element_type)
    width = _element_width(element_type)

    def array(buf: bytes, start: int) -> list[Any]:
        n = _I64.unpack_from(buf, start)[0]
        first = start + 8 + _bitset_bytes(n)
        return [
            None if _null_bits(buf, start + 8, i) else read(buf, start, first + i * width)
            for i in range(n)
        ]

    return array


def fields_decoder(schema: T.StructType) -> Callable[[bytes, int, int], list[Any]]:
    """A decoder of an ``UnsafeRow`` of ``schema`` at ``(buffer, start, size)`` to its values."""
    readers = [value_reader(f.dataType) for f in schema.fields]
    n = len(readers)
    slots = _bitset_bytes(n)

    def decode(buf: bytes, start: int, size: int) -> list[Any]:
        if size < slots + 8 * n:
            raise ValueError(f"a row of {n} fields cannot be {size} bytes")
        return [
            None if _null_bits(buf, start, i) else read(buf, start, start + slots + 8 * i)
            for i, read in enumerate(readers)
        ]

    return decode


def row_decoder(schema: T.StructType) -> Callable[[bytes, int, int], T.Row]:
    """A decoder of an ``UnsafeRow`` of ``schema`` to a pyspark ``Row`` with its field names."""
    values = fields_decoder(schema)
    if not schema.names:
        return lambda buf, start, size: T.Row()
    row_class = T.Row(*schema.names)
    return lambda buf, start, size: row_class(*values(buf, start, size))


# ---- keys: Spark's state store key encoders (UnsafeRowDataEncoder) ----


def _versioned(buf: bytes, start: int, end: int, what: str) -> tuple[int, int]:
    """The (start, size) of the row after a state encoding version byte."""
    if end <= start or buf[start] != STATE_ENCODING_VERSION:
        found = "nothing" if end <= start else f"version byte {buf[start]}"
        raise ValueError(f"{what}: expected state encoding version 0, found {found}")
    return start + 1, end - start - 1


def _ordering_reader(data_type: T.DataType) -> Callable[[bytes], Any]:
    """A reader of one range-scan ordering column: a marker byte, then the value big-endian
    (negative floats and doubles with every bit flipped)."""

    def signed(fmt: str) -> Callable[[bytes], Any]:
        unpack = struct.Struct(fmt).unpack_from
        return lambda b: unpack(b, 1)[0]

    def floating(bits: str, value: str, mask: int) -> Callable[[bytes], Any]:
        raw, back = struct.Struct(bits), struct.Struct(value)

        def read(b: bytes) -> float:
            word = raw.unpack_from(b, 1)[0]
            if b[0] == _NEGATIVE:
                word ^= mask
            return back.unpack(raw.pack(word))[0]

        return read

    if isinstance(data_type, T.BooleanType):
        return lambda b: len(b) > 1 and b[1] != 0
    if isinstance(data_type, T.ByteType):
        return signed(">b")
    if isinstance(data_type, T.ShortType):
        return signed(">h")
    if isinstance(data_type, T.IntegerType):
        return signed(">i")
    if isinstance(data_type, T.LongType):
        return signed(">q")
    if isinstance(data_type, T.FloatType):
        return floating(">I", ">f", 0xFFFFFFFF)
    if isinstance(data_type, T.DoubleType):
        return floating(">Q", ">d", 0xFFFFFFFFFFFFFFFF)
    raise UnsupportedTypeError(
        f"range-scan ordering column of type {data_type.simpleString()} is not decoded"
    )


def key_decoder(
    key_schema: T.StructType, key_spec: dict[str, Any]
) -> tuple[Callable[[bytes], tuple[Any, ...]], bool]:
    """A decoder of a column family's stored keys to tuples of the key columns, and whether
    its stored keys end with a 4-byte key-group tag (``rocks.KeyGroups``: only a range scan
    over every key column keeps it; the decoder drops it)."""
    kind = key_spec.get("keyStateEncoderType")
    n = len(key_schema.fields)
    if kind == "NoPrefixKeyStateEncoderSpec":
        whole = fields_decoder(key_schema)

        def no_prefix(key: bytes) -> tuple[Any, ...]:
            start, size = _versioned(key, 0, len(key), "key")
            return tuple(whole(key, start, size))

        return no_prefix, False
    if kind == "PrefixKeyScanStateEncoderSpec":
        split = int(key_spec["numColsPrefixKey"])
        prefix = fields_decoder(T.StructType(key_schema.fields[:split]))
        rest = fields_decoder(T.StructType(key_schema.fields[split:]))

        def prefix_scan(key: bytes) -> tuple[Any, ...]:
            length = _I32.unpack_from(key, 0)[0]
            start, size = _versioned(key, 4, 4 + length, "key prefix")
            values = prefix(key, start, size)
            start, size = _versioned(key, 4 + length, len(key), "key")
            return tuple(values + rest(key, start, size))

        return prefix_scan, False
    if kind == "RangeKeyScanStateEncoderSpec":
        ordering = [int(i) for i in key_spec["orderingOrdinals"]]
        remaining = [i for i in range(n) if i not in ordering]
        as_binary = T.StructType([T.StructField(f"o{i}", T.BinaryType()) for i in ordering])
        ordered = fields_decoder(as_binary)
        readers = [_ordering_reader(key_schema.fields[i].dataType) for i in ordering]
        rest = fields_decoder(T.StructType([key_schema.fields[i] for i in remaining]))
        tagged = not remaining

        def range_scan(key: bytes) -> tuple[Any, ...]:
            end = len(key) - 4 if tagged else len(key)
            length = _I32.unpack_from(key, 0)[0]
            start, size = _versioned(key, 4, 4 + length, "range-scan key")
            values: list[Any] = [None] * n
            raws = ordered(key, start, size)
            for ordinal, read, raw in zip(ordering, readers, raws, strict=True):
                values[ordinal] = None if raw is None or raw[0] == _NULL else read(raw)
            if remaining:
                start, size = _versioned(key, 4 + length, end, "key")
                for ordinal, value in zip(remaining, rest(key, start, size), strict=True):
                    values[ordinal] = value
            return tuple(values)

        return range_scan, tagged
    raise UnsupportedTypeError(f"keys encoded by {kind or key_spec} are not decoded")
