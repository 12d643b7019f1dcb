"""What the server's catalog says about the sink's table, and whether a DataFrame fits it: the
table resolved as SQL resolves its name, its columns, the unique key an upsert needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyedstate.sinks.postgres.errors import PostgresSinkError
from keyedstate.sinks.postgres.types import compatible, pg_type

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql.types import StructType


@dataclass
class Column:
    name: str
    type: str  # format_type(), e.g. "bigint", "character varying(20)"
    category: str  # pg_type.typcategory: S string, N numeric, D date/time, ...
    not_null: bool
    has_default: bool
    generated: bool

    def __str__(self) -> str:
        return f"{self.name} {self.type}"


def resolve_table(
    connection: psycopg.Connection[Any], table: str, *, dbname: str | None, server: str
) -> tuple[int, tuple[str, str]]:
    """The table's oid and (schema, name), ``table`` resolved as SQL does (``name`` on the
    search path, or ``schema.name``)."""
    oid_row = connection.execute("SELECT to_regclass(%s)::oid", [table]).fetchone()
    if oid_row is None or oid_row[0] is None:
        connection.rollback()
        raise PostgresSinkError(
            f"postgres sink: table {table!r} does not exist in database "
            f"{dbname!r} on {server}. Create it first (CREATE TABLE "
            f"{table} (...) with the DataFrame's columns)"
        )
    oid = oid_row[0]
    schema, name = connection.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = %s",
        [oid],
    ).fetchone() or ("?", "?")
    return oid, (schema, name)


def table_columns(connection: psycopg.Connection[Any], oid: int) -> dict[str, Column]:
    """The table's columns by name, in the table's order."""
    rows = connection.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory, "
        "a.attnotnull, a.atthasdef OR a.attidentity <> '', a.attgenerated <> '' "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    ).fetchall()
    return {r[0]: Column(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows}


def check_unique_key(
    connection: psycopg.Connection[Any],
    oid: int,
    columns: dict[str, Column],
    key_columns: Sequence[str],
    table_name: str,
) -> None:
    """Raise ``PostgresSinkError`` unless ``key_columns`` are the table's and a unique index or
    primary key covers exactly them (what ``ON CONFLICT`` needs)."""
    unknown = [k for k in key_columns if k not in columns]
    if unknown:
        raise PostgresSinkError(
            f"postgres sink: key column(s) {', '.join(unknown)} not in table "
            f"{table_name} (columns: {', '.join(columns)}). Pass key_columns that name "
            "the table's unique key"
        )
    # ON CONFLICT (keys) needs a non-partial unique index on exactly these columns.
    indexes = connection.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL "
        "AND i.indexprs IS NULL GROUP BY i.indexrelid",
        [oid],
    ).fetchall()
    if not any(sorted(r[0]) == sorted(key_columns) for r in indexes):
        keys = ", ".join(key_columns)
        raise PostgresSinkError(
            f"postgres sink: table {table_name} has no unique index or primary key on "
            f"exactly ({keys}), which upsert needs. Fix: ALTER TABLE {table_name} ADD "
            f"PRIMARY KEY ({keys}) (or CREATE UNIQUE INDEX ON {table_name} ({keys}))"
        )


def check_schema(
    schema: StructType,
    columns: dict[str, Column],
    *,
    table_name: str,
    server: str,
    upsert_keys: Sequence[str] | None,
) -> None:
    """Raise ``PostgresSinkError`` naming every mismatch and its fix if a DataFrame of
    ``schema`` cannot be written to the table (``upsert_keys``: the key columns an upsert needs
    in the DataFrame, ``None`` for append)."""
    problems: list[str] = []
    fixes: list[str] = []
    names = schema.fieldNames()
    missing = [f for f in schema.fields if f.name not in columns]
    if missing:
        problems.append("not in the table: " + ", ".join(f.name for f in missing))
        fixes.append(
            f"ALTER TABLE {table_name} "
            + ", ".join(f"ADD COLUMN {f.name} {pg_type(f.dataType)}" for f in missing)
            + ", or select/rename the DataFrame's columns"
        )
    required = [c for c in columns.values() if c.not_null and not c.has_default]
    unfilled = [c.name for c in required if c.name not in names]
    if unfilled:
        problems.append(
            "NOT NULL without default, missing in the DataFrame: " + ", ".join(unfilled)
        )
        fixes.append("add these columns to the DataFrame or give them a default")
    generated = [n for n in names if n in columns and columns[n].generated]
    if generated:
        problems.append("generated in the table: " + ", ".join(generated))
        fixes.append("drop these columns from the DataFrame")
    for f in schema.fields:
        column = columns.get(f.name)
        if column is not None and not compatible(f.dataType, column.category):
            problems.append(
                f"{f.name} is {f.dataType.simpleString()} in the DataFrame but {column.type} "
                "in the table"
            )
            fixes.append(f"cast {f.name} in the DataFrame or change the column's type")
    if upsert_keys is not None:
        absent = [k for k in upsert_keys if k not in names]
        if absent:
            problems.append("key column(s) missing in the DataFrame: " + ", ".join(absent))
            fixes.append("select the key columns")
    if problems:
        expected = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
        actual = ", ".join(str(c) for c in columns.values())
        raise PostgresSinkError(
            f"postgres sink: table {table_name} on {server} does not match the "
            f"DataFrame ({'; '.join(problems)}). DataFrame: ({expected}); table: ({actual}). "
            f"Fix: {'; '.join(fixes)}"
        )
