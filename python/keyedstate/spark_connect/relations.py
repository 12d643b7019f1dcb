"""keyedstate's relations in a Spark Connect plan.

A relation is a ``google.protobuf.Any`` in ``Relation.extension``: its type URL names the kind
(``type.googleapis.com/keyedstate.lookup``), its value holds, in the protobuf wire format, a JSON
object (field 1) and the input relations it names as ``{"$relation": i}`` (field 2, repeated:
Spark's own ``Relation`` messages, serialized). The server's plugin
(``io.keyedstate.sparkconnect.ExtensionMessage``) reads it without protobuf classes of its own,
so the two sides share no generated code; inputs stay raw bytes, so a chain of keyed functions
(each nesting its input twice) grows by a few bytes per level, not by a text encoding's third.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyspark.sql.connect.proto as proto
from pyspark.errors import PySparkException
from pyspark.sql import types as T
from pyspark.sql.connect.client import SparkConnectClient
from pyspark.sql.connect.dataframe import DataFrame
from pyspark.sql.connect.plan import LogicalPlan
from pyspark.sql.connect.session import SparkSession

from keyedstate._error_catalog import INVALID_OPTION
from keyedstate._version import __version__
from keyedstate.errors import error_of, keyedstate_errors

__all__ = ["apply", "lookup", "operation", "out_schema", "state_read"]

TYPE_URL_PREFIX = "type.googleapis.com/keyedstate."


class KeyedStateRelation(LogicalPlan):
    """One keyedstate relation: ``kind``, its ``fields`` (JSON values) and its ``inputs``
    (plans)."""

    def __init__(
        self,
        kind: str,
        fields: Mapping[str, Any],
        inputs: Mapping[str, LogicalPlan],
        frames: Mapping[str, LogicalPlan] | None = None,
    ) -> None:
        super().__init__(next(iter(inputs.values()), None))
        self._kind = kind
        self._fields = dict(fields)
        self._inputs = dict(inputs)
        self._frames = dict(frames or {})  # an operation's DataFrames, by name

    def plan(self, session: SparkConnectClient) -> proto.Relation:
        relation = self._create_proto_relation()
        relations: list[bytes] = []

        def named(plan: LogicalPlan) -> dict[str, int]:
            relations.append(plan.plan(session).SerializeToString())
            return {"$relation": len(relations) - 1}

        # The server checks it is its own version (KEYEDSTATE_CONNECT_VERSION_MISMATCH).
        body: dict[str, Any] = {"client": __version__, **self._fields}
        for name, child in self._inputs.items():
            body[name] = named(child)
        if self._frames:
            body["frames"] = {name: named(p) for name, p in self._frames.items()}
        relation.extension.type_url = TYPE_URL_PREFIX + self._kind
        relation.extension.value = _field(1, json.dumps(body).encode("utf-8")) + b"".join(
            _field(2, r) for r in relations
        )
        return relation

    def __repr__(self) -> str:
        return f"KeyedStateRelation({self._kind})"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _frame(relation: KeyedStateRelation, like: DataFrame) -> DataFrame:
    return DataFrame(relation, like.sparkSession)


def operation(
    spark: SparkSession,
    name: str,
    arguments: list[Any],
    frames: Mapping[str, DataFrame] | None = None,
) -> str:
    """Runs offline operation ``name`` on the server (``ConnectOperations`` of
    ``io.keyedstate.sparkconnect``: the entry point py4j calls in a classic session), given
    ``frames`` (DataFrames by name), and returns its JSON answer. Collected once: the server
    runs the operation when the relation executes."""
    plans = {name: frame._plan for name, frame in (frames or {}).items()}
    relation = KeyedStateRelation("operation", {"name": name, "arguments": arguments}, {}, plans)
    [row] = DataFrame(relation, spark).collect()
    return str(row[0])


def state_read(
    spark: SparkSession, path: str, operator: str, state: str, batch_id: int, flatten: bool
) -> DataFrame:
    """``keyedstate.state.read``'s DataFrame, planned on the server."""
    fields = {
        "path": path,
        "operator": operator,
        "state": state,
        "batchId": batch_id,
        "flatten": flatten,
    }
    return DataFrame(KeyedStateRelation("stateRead", fields, {}), spark)


def lookup(df: DataFrame, broadcast: DataFrame | None, spec_json: str) -> DataFrame:
    """``KeyedProcess.lookup``'s relation: the rows the keyed function's Python reads."""
    inputs = {"input": df._plan}
    if broadcast is not None:
        inputs["broadcast"] = broadcast._plan
    return _frame(KeyedStateRelation("lookup", {"spec": spec_json}, inputs), df)


@keyedstate_errors  # the first relation a keyed function sends: a refusal is keyedstate's error
def out_schema(df: DataFrame, spec_json: str) -> T.StructType:
    """``KeyedProcess.outSchemaJson``: the schema the keyed function's Python returns (the
    schema of an empty relation the server plans for it)."""
    fields = {"spec": spec_json, "inputSchema": df.schema.json()}
    try:
        return _frame(KeyedStateRelation("outSchema", fields, {}), df).schema
    except PySparkException as error:
        if TYPE_URL_PREFIX in str(error):  # Spark found no plugin for keyedstate's relations
            raise error_of(
                INVALID_OPTION,
                "the Spark Connect server does not plan keyedstate's relations: start it with "
                "`keyedstate connect-server` (or with spark.connect.extensions.relation.classes="
                "io.keyedstate.sparkconnect.KeyedStateRelationPlugin and keyedstate's jar, "
                "docs/spark-connect.md)",
            ) from error
        raise


def apply(mapped: DataFrame, spec_json: str, input_schema: T.StructType) -> DataFrame:
    """``KeyedProcess.apply``'s relation over what ``mapInArrow`` returned."""
    fields = {"spec": spec_json, "inputSchema": input_schema.json()}
    return _frame(KeyedStateRelation("apply", fields, {"input": mapped._plan}), mapped)
