"""Spark's types and PostgreSQL's: the column type a schema fix suggests, the type categories a
Spark type can be written to, and the conversions COPY needs for collected Spark values."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType


def pg_type(data_type: DataType) -> str:
    """A PostgreSQL type for a Spark type, for the fix a schema error suggests."""
    name = type(data_type).__name__
    return {
        "StringType": "text",
        "VarcharType": "text",
        "CharType": "text",
        "LongType": "bigint",
        "IntegerType": "integer",
        "ShortType": "smallint",
        "ByteType": "smallint",
        "DoubleType": "double precision",
        "FloatType": "real",
        "BooleanType": "boolean",
        "DateType": "date",
        "TimestampType": "timestamptz",
        "TimestampNTZType": "timestamp",
        "BinaryType": "bytea",
        "DecimalType": "numeric",
        "MapType": "jsonb",
        "StructType": "jsonb",
    }.get(name, "jsonb" if name == "ArrayType" else "text")


# Spark type -> the PostgreSQL type categories (pg_type.typcategory) it can be written to.
_CATEGORIES = {
    "StringType": "SUE",  # text types, json/uuid/..., enums
    "VarcharType": "SUE",
    "CharType": "SUE",
    "LongType": "N",
    "IntegerType": "N",
    "ShortType": "N",
    "ByteType": "N",
    "DoubleType": "N",
    "FloatType": "N",
    "DecimalType": "N",
    "BooleanType": "B",
    "DateType": "D",
    "TimestampType": "D",
    "TimestampNTZType": "D",
    "BinaryType": "U",
    "ArrayType": "A",
    "MapType": "U",
    "StructType": "U",
    "DayTimeIntervalType": "T",
}


def compatible(data_type: DataType, category: str) -> bool:
    """Whether a Spark type can be written to a column of this ``pg_type.typcategory``."""
    allowed = _CATEGORIES.get(type(data_type).__name__)
    return allowed is None or category in allowed


def copy_converters(schema: StructType) -> list[tuple[int, Callable[[Any], Any]]]:
    """Per-column conversions from collected Spark values to what COPY writes correctly."""
    from psycopg.types.json import Jsonb

    result: list[tuple[int, Callable[[Any], Any]]] = []
    for index, f in enumerate(schema.fields):
        name = type(f.dataType).__name__
        if name == "TimestampType":
            # Collected as naive local time; make it an instant for timestamptz.
            result.append((index, lambda v: None if v is None else v.astimezone(dt.timezone.utc)))
        elif name in ("MapType", "StructType"):
            result.append((index, lambda v: None if v is None else Jsonb(_plain(v))))
        elif name == "BinaryType":
            result.append((index, lambda v: None if v is None else bytes(v)))
    return result


def _plain(value: Any) -> Any:  # noqa: ANN401 - any collected Spark value
    from pyspark.sql import Row

    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if hasattr(value, "is_finite"):  # Decimal
        return str(value)
    return value
