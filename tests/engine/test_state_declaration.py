"""A keyed function's declaration (its uid, function, key columns and each state's kind and
type) is kept in every committed version's manifest, with the state: it cannot be lost apart
from it, a refused run never rewrites it, and a version without one is refused. Operator ids
follow the order in which a query applies its keyed functions, and tools find a function by
its uid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import (
    CheckpointedFunction,
    FlatMapFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    key_by,
)
from keyedstate.state.descriptors import BROADCAST, KEYED_STATE_DESCRIPTORS, OPERATOR_STATE_KINDS
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from tests.support.state_api_support import ship_by_value
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    await_finished,
    committed_batches,
    refusal,
    start_query,
)

SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.LongType())])
OUT = "k string, n long"


class Sum(KeyedProcessFunction):
    """Sums ``v`` per key in a state ``total`` declared as a long, or (``as_text``) counts in a
    string: the same function with its state's type changed."""

    def __init__(self, as_text: bool = False) -> None:
        self.as_text = as_text

    def open(self, runtime_context: RuntimeContext) -> None:
        declared = Types.STRING() if self.as_text else Types.LONG()
        self.total = runtime_context.get_state(ValueStateDescriptor("total", declared))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        if self.as_text:
            text = (self.total.value() or "") + "x"
            self.total.update(text)
            yield (value.k, len(text))
        else:
            total = (self.total.value() or 0) + value.v
            self.total.update(total)
            yield (value.k, total)


class Count(KeyedProcessFunction):
    """Counts elements per key in a state named ``n`` (as does the next function of a chain)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        yield (value.k, n)


class Maximum(KeyedProcessFunction):
    """Keeps the largest count seen per key in a state also named ``n``."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:  # noqa: ANN401
        n = max(self.n.value() or 0, value.n * 100)
        self.n.update(n)
        yield (value.k, n)


ship_by_value(__name__)


def run(spark: SparkSession, frame: DataFrame, checkpoint: Path) -> BatchCollector:
    collector = BatchCollector()
    await_finished(start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector))
    return collector


def manifests(checkpoint: Path, operator: int) -> list[Path]:
    return sorted((checkpoint / "state" / str(operator)).glob("*/*.manifest"))


def test_the_declaration_is_kept_in_each_manifest_and_a_refused_run_does_not_change_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "checkpoint"
    source.add([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    run(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    # Nothing outside the manifests holds it (an earlier layout kept state/<op>/_keyedstate/
    # schema.json, whose loss turned the check off): drop such a file if one was written.
    for side_file in (checkpoint / "state" / "1000").glob("_keyedstate"):
        shutil.rmtree(side_file)
    source.add([{"k": "a", "v": 10}])
    error = refusal(
        spark, key_by(source.read_stream(spark), "k").process(Sum(as_text=True), OUT), checkpoint
    )
    assert error.error_id == "KEYED_FUNCTION_STATE_CHANGED", error
    assert committed_batches(checkpoint) == [0]
    for manifest in manifests(checkpoint, 1000):
        declaration = json.loads(manifest.read_text())["declaration"]
        assert declaration["function"] == "Sum" and declaration["kind"] == "keyedFunction"
        assert [(s["name"], s["kind"], s["type"]) for s in declaration["states"]] == [
            ("total", "value", "long")
        ]

    # The refused run changed nothing: the original code continues where it stopped.
    collector = run(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    assert collector.batches == {1: [{"k": "a", "n": 11}]}, collector.batches
    assert keyedstate.state.read(spark, str(checkpoint), state="total").drop("partition_id").sort(
        "k"
    ).collect() == [("a", 11), ("b", 2)]


def test_a_state_type_change_is_refused_before_any_state_is_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "checkpoint"
    source.add([{"k": "a", "v": 1}])
    keyed = key_by(source.read_stream(spark), "k")
    run(spark, keyed.process(Sum(), OUT, uid="totals"), checkpoint)
    source.add([{"k": "a", "v": 2}])
    error = refusal(
        spark,
        key_by(source.read_stream(spark), "k").process(Sum(as_text=True), OUT, uid="totals"),
        checkpoint,
    )
    assert isinstance(error, keyedstate.KeyedFunctionError)
    assert error.error_id == "KEYED_FUNCTION_STATE_CHANGED", error
    assert "state 'total' (column family 'total') of stateful operator 1000" in str(error)
    assert "keyed function Sum (uid 'totals')" in str(error)
    assert (
        "was stored as value state of bigint and is now declared as value state of string"
        in str(error)
    )


def test_a_version_whose_manifest_lost_its_declaration_is_refused_naming_the_manifest(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "checkpoint"
    source.add([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    run(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    stripped = []
    for manifest in manifests(checkpoint, 1000):
        content = json.loads(manifest.read_text())
        del content["declaration"]
        manifest.write_text(json.dumps(content))
        manifest.with_name(f".{manifest.name}.crc").unlink(missing_ok=True)
        stripped.append(manifest)
    source.add([{"k": "a", "v": 10}])
    error = refusal(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    assert error.error_id == "KEYED_FUNCTION_DECLARATION_MISSING", error
    message = str(error)
    assert "state version 1 of stateful operator 1000" in message, message
    assert str(stripped[0]) in message, message


def chain(
    spark: SparkSession,
    source: FileInput,
    first: KeyedProcessFunction,
    second: KeyedProcessFunction,
    uids: tuple[str, str] | None = None,
) -> DataFrame:
    first_uid, second_uid = uids or (None, None)
    counted = key_by(source.read_stream(spark), "k").process(first, OUT, uid=first_uid)
    return key_by(counted, "k").process(second, OUT, uid=second_uid)


def read_n(spark: SparkSession, checkpoint: Path, operator: str | int) -> list[tuple[str, int]]:
    frame = keyedstate.state.read(spark, str(checkpoint), operator, "n")
    return sorted(tuple(r) for r in frame.drop("partition_id").collect())


COUNTS, MAXIMA = [("a", 2), ("b", 1)], [("a", 200), ("b", 100)]
ROWS = [{"k": "a", "v": 1}, {"k": "a", "v": 1}, {"k": "b", "v": 1}]


def test_chained_functions_without_uids_are_numbered_in_order(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "checkpoint"
    source.add(ROWS)
    run(spark, chain(spark, source, Count(), Maximum()), checkpoint)
    # The docs' order: a chain's first function is operator 1000, the next 1001.
    assert read_n(spark, checkpoint, 1000) == COUNTS
    assert read_n(spark, checkpoint, 1001) == MAXIMA
    with pytest.raises(keyedstate.QueryCheckpointError, match="several stateful") as several:
        keyedstate.state.read(spark, str(checkpoint), state="n")
    assert (
        "operator 1000: keyed function Count, states 'n'; operator 1001: keyed function Maximum"
    ) in str(several.value)

    # The functions swapped: each operator's state would go to the other function.
    source.add([{"k": "a", "v": 1}])
    error = refusal(spark, chain(spark, source, Maximum(), Count()), checkpoint)
    assert error.error_id == "KEYED_FUNCTION_UID_CHANGED", error
    # Operator 1001 held Maximum's state and would now run Count.
    message = str(error)
    assert "stateful operator 1001 (KeyedStateApplyExec / keyed function Count," in message
    assert "holds the state of keyed function Maximum, and the query now runs Count" in message


def test_keyed_functions_are_found_and_checked_by_uid(spark: SparkSession, tmp_path: Path) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "checkpoint"
    source.add(ROWS)
    run(spark, chain(spark, source, Count(), Maximum(), ("counts", "maxima")), checkpoint)
    assert read_n(spark, checkpoint, "counts") == COUNTS
    assert read_n(spark, checkpoint, "maxima") == MAXIMA
    report = keyedstate.inspect(spark, str(checkpoint))
    assert [(o.operator_id, o.operator_name, o.function, o.uid) for o in report.operators] == [
        (1000, "keyedProcess", "Count", "counts"),
        (1001, "keyedProcess", "Maximum", "maxima"),
    ]
    with pytest.raises(keyedstate.QueryCheckpointError, match="no keyed function with uid 'max'"):
        read_n(spark, checkpoint, "max")
    # Spark's own reader names each operator's function too (its operator properties).
    metadata = spark.read.format("state-metadata").load(str(checkpoint)).collect()
    properties = {r["operatorId"]: json.loads(r["operatorProperties"]) for r in metadata}
    assert {op: (p["function"], p["uid"]) for op, p in properties.items()} == {
        1000: ("Count", "counts"),
        1001: ("Maximum", "maxima"),
    }
    assert {r["operatorName"] for r in metadata} == {"keyedProcess"}

    # Swapped: operator 1001 holds the state of uid "maxima", and would now run "counts".
    source.add([{"k": "a", "v": 1}])
    error = refusal(
        spark, chain(spark, source, Maximum(), Count(), ("maxima", "counts")), checkpoint
    )
    assert error.error_id == "KEYED_FUNCTION_UID_CHANGED", error
    assert "holds the state of keyed function Maximum (uid 'maxima')" in str(error), error


def test_a_damaged_declaration_is_reported_as_a_corrupt_manifest(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "checkpoint"
    source.add([{"k": "a", "v": 1}])
    run(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    damaged = manifests(checkpoint, 1000)[0]
    content = json.loads(damaged.read_text())
    content["declaration"]["states"][0]["type"] = "no such type"
    damaged.write_text(json.dumps(content))
    damaged.with_name(f".{damaged.name}.crc").unlink(missing_ok=True)
    source.add([{"k": "a", "v": 10}])
    error = refusal(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    assert isinstance(error, keyedstate.CheckpointError), error
    assert error.error_id == "KEYEDSTATE_CHECKPOINT_FILE_CORRUPT", error
    assert f"{damaged} holds a keyed function declaration that cannot be read" in str(error)


def test_each_task_checks_its_own_partitions_declaration(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Partition 0's manifest is intact (the driver's check passes); partition 1's lost its
    declaration: the task that loads partition 1 refuses it before reading any state."""
    source = FileInput(tmp_path / "input", SCHEMA)
    checkpoint = tmp_path / "checkpoint"
    source.add([{"k": f"k{i}", "v": i} for i in range(10)])
    run(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    (stripped,) = sorted((checkpoint / "state" / "1000" / "1").glob("*.manifest"))
    content = json.loads(stripped.read_text())
    del content["declaration"]
    stripped.write_text(json.dumps(content))
    stripped.with_name(f".{stripped.name}.crc").unlink(missing_ok=True)
    source.add([{"k": f"k{i}", "v": 1} for i in range(10)])
    error = refusal(spark, key_by(source.read_stream(spark), "k").process(Sum(), OUT), checkpoint)
    assert error.error_id == "KEYED_FUNCTION_DECLARATION_MISSING", error
    assert str(stripped) in str(error), error
    assert committed_batches(checkpoint) == [0]


def test_python_and_the_jvm_know_the_same_state_kinds(spark: SparkSession) -> None:
    """The kinds Python declares states with (one descriptor each, plus the two operator states) are
    exactly the kinds the JVM parses (``io.keyedstate.engine.StateKind``), and it refuses others
    naming them."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    kinds = jvm.io.keyedstate.engine.StateKind
    names = kinds.names()
    assert {str(names.apply(i)) for i in range(names.size())} == {
        *KEYED_STATE_DESCRIPTORS, *OPERATOR_STATE_KINDS, BROADCAST
    }
    with pytest.raises(Exception, match="unknown state kind 'queryable'"):
        kinds.parse("queryable")


class OperatorCount(FlatMapFunction, CheckpointedFunction):
    """Counts elements in operator state ``n``, created by ``method`` (``get_list_state`` or
    ``get_union_list_state``; ``both`` asks for it with one, then the other)."""

    def __init__(self, method: str) -> None:
        self.method = method

    def initialize_state(self, context: Any) -> None:  # noqa: ANN401
        store = context.get_operator_state_store()
        descriptor = ListStateDescriptor("n", Types.LONG())
        if self.method == "both":
            store.get_list_state(descriptor)
            store.get_union_list_state(descriptor)
        self.n = getattr(store, self.method if self.method != "both" else "get_list_state")(
            descriptor
        )

    def flat_map(self, value: Any) -> Any:  # noqa: ANN401
        yield value.k, 1

    def snapshot_state(self, context: Any) -> None:  # noqa: ANN401
        self.n.update([1])


def test_an_operator_state_is_redistributed_one_way(spark: SparkSession, tmp_path: Path) -> None:
    """As Flink refuses an incompatible assignment mode: one name asked for with both methods is
    refused when the query is planned, and a restart that switches a stored state from even split
    to union is refused naming both kinds."""
    source = FileInput(tmp_path / "input", SCHEMA)
    source.add([{"k": "a", "v": 1}])
    with pytest.raises(keyedstate.StateUsageError, match=r"operator state 'n' was created with "
                       r"get_list_state\(\) and is now asked for with get_union_list_state\(\)"):
        key_by(source.read_stream(spark), "k").flat_map(OperatorCount("both"), OUT)
    checkpoint = tmp_path / "checkpoint"
    keyed = key_by(source.read_stream(spark), "k")
    run(spark, keyed.flat_map(OperatorCount("get_list_state"), OUT, uid="counts"), checkpoint)
    source.add([{"k": "a", "v": 2}])
    error = refusal(
        spark,
        key_by(source.read_stream(spark), "k").flat_map(
            OperatorCount("get_union_list_state"), OUT, uid="counts"
        ),
        checkpoint,
    )
    assert error.error_id == "KEYED_FUNCTION_STATE_CHANGED", error
    assert "state 'n' (column family '$op_n')" in str(error)
    assert "operator_list state of bigint and is now declared as operator_union_list" in str(error)
