"""keyedstate's relations in a Spark Connect plan.

A relation is a ``google.protobuf.Any`` in ``Relation.extension``: its type URL names the kind
(``type.googleapis.com/keyedstate.lookup``), its value is a JSON object whose input relations
are Spark's own ``Relation`` messages in base64. The server's plugin
(``io.keyedstate.connect.ExtensionMessage``) reads it without protobuf classes of its own, so the
two sides share no generated code.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pyspark.sql.connect.proto as proto
from pyspark.sql import types as T
from pyspark.sql.connect.client import SparkConnectClient
from pyspark.sql.connect.dataframe import DataFrame
from pyspark.sql.connect.plan import LogicalPlan
from pyspark.sql.connect.session import SparkSession

from keyedstate._version import __version__
from keyedstate.errors import keyedstate_errors

__all__ = ["apply", "lookup", "operation", "out_schema", "state_read"]

TYPE_URL_PREFIX = "type.googleapis.com/keyedstate."


class KeyedStateRelation(LogicalPlan):
    """One keyedstate relation: ``kind``, its ``fields`` (JSON values) and its ``inputs``
    (plans)."""

    def __init__(
        self, kind: str, fields: Mapping[str, Any], inputs: Mapping[str, LogicalPlan]
    ) -> None:
        super().__init__(next(iter(inputs.values()), None))
        self._kind = kind
        self._fields = dict(fields)
        self._inputs = dict(inputs)

    def plan(self, session: SparkConnectClient) -> proto.Relation:
        relation = self._create_proto_relation()
        # The server checks it is its own version (KEYEDSTATE_CONNECT_VERSION_MISMATCH).
        body: dict[str, Any] = {"client": __version__, **self._fields}
        for name, child in self._inputs.items():
            body[name] = base64.b64encode(child.plan(session).SerializeToString()).decode("ascii")
        relation.extension.type_url = TYPE_URL_PREFIX + self._kind
        relation.extension.value = json.dumps(body).encode("utf-8")
        return relation

    def __repr__(self) -> str:
        return f"KeyedStateRelation({self._kind})"


def _frame(relation: KeyedStateRelation, like: DataFrame) -> DataFrame:
    return DataFrame(relation, like.sparkSession)


def operation(spark: SparkSession, name: str, arguments: list[Any]) -> str:
    """Runs offline operation ``name`` on the server (``io.keyedstate.connect.ConnectOperations``:
    the entry point py4j calls in a classic session) and returns its JSON answer. Collected
    once: the server runs the operation when the relation executes."""
    relation = KeyedStateRelation("operation", {"name": name, "arguments": arguments}, {})
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
    return _frame(KeyedStateRelation("outSchema", fields, {}), df).schema


def apply(mapped: DataFrame, spec_json: str, input_schema: T.StructType) -> DataFrame:
    """``KeyedProcess.apply``'s relation over what ``mapInArrow`` returned."""
    fields = {"spec": spec_json, "inputSchema": input_schema.json()}
    return _frame(KeyedStateRelation("apply", fields, {"input": mapped._plan}), mapped)
