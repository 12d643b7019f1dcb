"""keyedstate's errors reach Python as one class per identifier family (``keyedstate.errors``):
a failed streaming query, a refused rescale, a bad option, each on real Spark and a real
checkpoint, with the identifier, keyedstate's one line (the path, the version) and the original
error chained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keyedstate
import pytest
from keyedstate import (
    KeyedProcessFunction,
    OutputTag,
    RuntimeContext,
    Types,
    ValueStateDescriptor,
    errors,
    key_by,
)
from keyedstate._error_catalog import ERROR_CLASSES
from pyspark.errors import IllegalArgumentException, StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from tests.support.state_api_support import ship_by_value
from tests.support.streaming_harness import (
    PROVIDER_UNDER_TEST,
    BatchCollector,
    FileInput,
    start_query,
)

ship_by_value(__name__)

SQL_PROVIDER = "spark.sql.streaming.stateStore.providerClass"


def start_counts(
    spark: SparkSession, source: Path, checkpoint: Path, foreach_batch: bool = False
) -> StreamingQuery:
    """An availableNow run of a count per key over ``source`` (20 new rows each time), into the
    noop sink or, with ``foreach_batch``, a ``foreachBatch`` function (every exactly-once sink is
    one) that collects the batch."""
    spark.range(20).selectExpr("id % 5 as k").write.mode("append").parquet(str(source))
    spark.conf.set(SQL_PROVIDER, keyedstate.PROVIDER_CLASS)
    writer = (
        spark.readStream.schema("k long").parquet(str(source)).groupBy("k").count()
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    )
    if foreach_batch:
        writer = writer.foreachBatch(lambda df, _batch_id: df.collect())
    else:
        writer = writer.format("noop")
    return writer.start()


def run_counts(
    spark: SparkSession, source: Path, checkpoint: Path, foreach_batch: bool = False
) -> None:
    start_counts(spark, source, checkpoint, foreach_batch).awaitTermination(180)


def manifest_of_version_1(checkpoint: Path) -> Path:
    manifest = checkpoint / "state" / "0" / "0" / "1.manifest"
    assert manifest.is_file(), sorted(p.name for p in manifest.parent.iterdir())
    return manifest


@pytest.mark.parametrize(
    ("damage", "error_id", "says"),
    [
        ("delete", "KEYEDSTATE_CHECKPOINT_FILE_MISSING", "State version 1 is missing: manifest"),
        ("garble", "KEYEDSTATE_CHECKPOINT_FILE_CORRUPT", "State version 1 has a corrupt manifest"),
    ],
)
def test_a_damaged_checkpoint_fails_the_restart_as_a_checkpoint_error(
    spark: SparkSession, tmp_path: Path, damage: str, error_id: str, says: str
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    run_counts(spark, source, checkpoint)
    manifest = manifest_of_version_1(checkpoint)
    if damage == "delete":
        manifest.unlink()
    else:
        manifest.write_text('{"version": 1, "snapshot')
    with pytest.raises(StreamingQueryException) as failure:
        run_counts(spark, source, checkpoint)
    # Spark's own class stays the outer error, keyedstate's its cause.
    assert "CANNOT_LOAD_STATE_STORE" in str(failure.value), str(failure.value)[:2000]

    error = errors.state_error(failure.value)
    assert isinstance(error, errors.CheckpointError)
    assert isinstance(error, keyedstate.KeyedStateError)
    assert error.error_id == error_id
    message = str(error)
    assert message.startswith(f"[{error_id}] Cannot load version 1 of state store "), message
    assert says in message and str(manifest) in message, message
    assert "\n" not in message
    assert error.__cause__ is failure.value


def test_the_failure_a_query_reports_afterwards_maps_the_same(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``StreamingQuery.exception()`` hands over only the JVM error's cause: still found."""
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    run_counts(spark, source, checkpoint)
    manifest_of_version_1(checkpoint).unlink()
    spark.range(20).selectExpr("id % 5 as k").write.mode("append").parquet(str(source))
    query = (
        spark.readStream.schema("k long").parquet(str(source)).groupBy("k").count()
        .writeStream.format("noop").outputMode("update")
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(180)
    reported = query.exception()
    assert reported is not None
    error = errors.state_error(reported)
    assert isinstance(error, errors.CheckpointError), reported
    assert error.error_id == "KEYEDSTATE_CHECKPOINT_FILE_MISSING"


def test_a_damaged_checkpoint_under_foreach_batch_is_a_checkpoint_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Under ``foreachBatch`` the batch's job runs from the Python function: its failure goes
    back to the JVM as the text of a py4j error (``FOREACH_BATCH_USER_FUNCTION_ERROR``), with
    keyedstate's error only as a ``Caused by:`` line of the stack trace it quotes."""
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    run_counts(spark, source, checkpoint, foreach_batch=True)
    manifest = manifest_of_version_1(checkpoint)
    manifest.write_text('{"version": 1, "snapshot')
    query = start_counts(spark, source, checkpoint, foreach_batch=True)
    with pytest.raises(StreamingQueryException) as failure:
        query.awaitTermination(180)
    assert "FOREACH_BATCH_USER_FUNCTION_ERROR" in str(failure.value), str(failure.value)[:2000]

    reported = query.exception()
    assert reported is not None
    for seen in (failure.value, reported):
        error = errors.state_error(seen)
        assert isinstance(error, errors.CheckpointError), str(seen)[:3000]
        assert error.error_id == "KEYEDSTATE_CHECKPOINT_FILE_CORRUPT"
        message = str(error)
        # The outermost keyedstate line: the store and the version, then the file.
        start = "[KEYEDSTATE_CHECKPOINT_FILE_CORRUPT] Cannot load version 1 of state store "
        assert message.startswith(start), message
        assert "State version 1 has a corrupt manifest" in message, message
        assert str(manifest) in message and "\n" not in message, message
        assert error.__cause__ is seen


# keyedstate's own errors raised in the Python worker, in the keyed function's task: they reach
# the driver as the text of Spark's PythonException, inside the py4j error under foreachBatch.


class StateOutsideOpen(KeyedProcessFunction):
    """Creates its state on first use instead of in ``open()``: never planned."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.context = runtime_context

    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        seen = self.context.get_state(ValueStateDescriptor("seen", Types.LONG()))
        seen.update((seen.value() or 0) + 1)
        yield (value.k, 1)


class TextForLong(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        yield (value.k, str(value.v))


class UndeclaredSideOutput(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:  # noqa: ANN401
        ctx.output(OutputTag("late"), value.v)
        yield (value.k, value.v)


WORKER_SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.LongType())])
STATE_NOT_PLANNED = (
    "state 'seen' was not declared when the query was planned: keyedstate learns a function's "
    "states by running open() once on the driver, so create every state in open() (or "
    "initialize_state())"
)


def failed_keyed_query(
    spark: SparkSession, workdir: Path, function: KeyedProcessFunction, foreach_batch: bool
) -> tuple[StreamingQueryException, StreamingQuery]:
    source = FileInput(workdir / "input", WORKER_SCHEMA)
    source.add([{"k": "a", "v": 1}])
    frame = key_by(source.read_stream(spark), "k").process(function, "k string, n long")
    checkpoint = workdir / "checkpoint"
    if foreach_batch:
        collector = BatchCollector()
        query = start_query(spark, PROVIDER_UNDER_TEST, frame, "append", checkpoint, collector)
    else:
        spark.conf.set(SQL_PROVIDER, PROVIDER_UNDER_TEST)
        query = (
            frame.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()
        )
    with pytest.raises(StreamingQueryException) as failure:
        query.awaitTermination(180)
    return failure.value, query


@pytest.mark.parametrize(
    ("function", "cls", "message"),
    [
        (StateOutsideOpen(), keyedstate.StateUsageError, STATE_NOT_PLANNED),
        (TextForLong(), keyedstate.StateTypeError, "output column 'n' is bigint, got str '1'"),
        (
            UndeclaredSideOutput(),
            keyedstate.StateUsageError,
            "side output 'late' was not declared: pass side_outputs=[...] to process()",
        ),
    ],
    ids=["state-not-in-open", "wrong-output-type", "undeclared-side-output"],
)
def test_errors_raised_in_the_python_worker_map_to_their_classes(
    spark: SparkSession,
    tmp_path: Path,
    function: KeyedProcessFunction,
    cls: type[Exception],
    message: str,
) -> None:
    """Through ``foreachBatch`` (what every exactly-once sink is), as the failure raised and as
    ``StreamingQuery.exception()`` reports it: the Python class it was raised as, its message,
    no identifier (raised in Python), never ``None``."""
    failure, query = failed_keyed_query(spark, tmp_path, function, foreach_batch=True)
    assert "FOREACH_BATCH_USER_FUNCTION_ERROR" in str(failure), str(failure)[:2000]
    reported = query.exception()
    assert reported is not None
    for seen in (failure, reported):
        error = errors.state_error(seen)
        assert isinstance(error, cls), str(seen)[:3000]
        assert isinstance(error, keyedstate.KeyedStateError)
        assert error.error_id is None
        assert str(error) == message
        assert error.__cause__ is seen


def test_an_error_raised_in_the_python_worker_is_found_without_foreach_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Into a sink that is not Python (noop): the failure is Spark's PythonException itself."""
    failure, _ = failed_keyed_query(spark, tmp_path, StateOutsideOpen(), foreach_batch=False)
    assert "PYTHON_EXCEPTION" in str(failure), str(failure)[:2000]
    error = errors.state_error(failure)
    assert isinstance(error, keyedstate.StateUsageError), str(failure)[:3000]
    assert str(error) == STATE_NOT_PLANNED and error.__cause__ is failure


def test_the_decorator_raises_the_mapped_class_from_the_original(
    spark: SparkSession, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    run_counts(spark, source, checkpoint)
    manifest_of_version_1(checkpoint).unlink()

    @errors.keyedstate_errors
    def restart() -> None:
        run_counts(spark, source, checkpoint)

    missing = r"^\[KEYEDSTATE_CHECKPOINT_FILE_MISSING\]"
    with pytest.raises(errors.CheckpointError, match=missing) as e:
        restart()
    assert isinstance(e.value.__cause__, StreamingQueryException)

    @errors.keyedstate_errors
    def other() -> None:
        raise KeyError("not keyedstate's")

    with pytest.raises(KeyError):
        other()


def test_a_refused_rescale_is_a_rescale_error_and_a_checkpoint_operation_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    run_counts(spark, source, checkpoint)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
    with pytest.raises(errors.RescaleError) as same:
        keyedstate.rescale(spark, str(checkpoint), partitions, str(tmp_path / "out"))
    assert isinstance(same.value, keyedstate.CheckpointOperationError)
    assert same.value.error_id == "KEYEDSTATE_RESCALE_REFUSED"
    message = str(same.value)
    assert message.startswith("[KEYEDSTATE_RESCALE_REFUSED] "), message
    assert f"{checkpoint} already has {partitions} state partitions" in message, message
    assert "nothing to rescale" in message and "\n" not in message
    with pytest.raises(keyedstate.CheckpointOperationError) as zero:
        keyedstate.rescale(spark, str(checkpoint), 0, str(tmp_path / "out"))
    assert isinstance(zero.value, errors.RescaleError) and "partition count 0" in str(zero.value)
    assert not (tmp_path / "out").exists()

    with pytest.raises(errors.QueryCheckpointError) as missing:
        keyedstate.inspect(spark, str(tmp_path / "nowhere"))
    assert isinstance(missing.value, keyedstate.CheckpointOperationError)
    assert missing.value.error_id == "KEYEDSTATE_QUERY_CHECKPOINT_INVALID"
    assert f"no checkpoint at file:{tmp_path / 'nowhere'}" in str(missing.value)


def test_inspect_refuses_a_format_v2_join(spark: SparkSession, tmp_path: Path) -> None:
    """A stream-stream join keeps four stores; with checkpoint format v2 the commit log records an
    id per store whose order inspect does not rely on: refused, naming the operator."""
    for side in ("left", "right"):
        spark.range(10).selectExpr("id as k", f"id as {side}_v").write.parquet(
            str(tmp_path / side)
        )
    key = "spark.sql.streaming.stateStore.checkpointFormatVersion"
    previous = spark.conf.get(key)
    spark.conf.set(SQL_PROVIDER, keyedstate.PROVIDER_CLASS)
    spark.conf.set(key, "2")
    try:
        left = spark.readStream.schema("k long, left_v long").parquet(str(tmp_path / "left"))
        right = spark.readStream.schema("k long, right_v long").parquet(str(tmp_path / "right"))
        query = (
            left.join(right, "k").writeStream.format("noop").outputMode("append")
            .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
        )
        query.awaitTermination(180)
    finally:
        spark.conf.set(key, previous)
    assert (tmp_path / "ckpt" / "commits" / "0").is_file()
    with pytest.raises(errors.QueryCheckpointError) as refused:
        keyedstate.inspect(spark, str(tmp_path / "ckpt"))
    message = str(refused.value)
    assert refused.value.error_id == "KEYEDSTATE_QUERY_CHECKPOINT_INVALID", message
    assert "operator 0 of file:" in message and "keeps several state stores" in message, message
    assert "checkpoint format v2" in message and "\n" not in message, message


def test_an_invalid_option_is_an_invalid_option_error(spark: SparkSession, tmp_path: Path) -> None:
    key = keyedstate.OPTION_PREFIX + "compression"
    spark.conf.set(SQL_PROVIDER, keyedstate.PROVIDER_CLASS)
    spark.conf.set(key, "brotli")
    try:
        with pytest.raises(IllegalArgumentException) as failure:
            (
                spark.readStream.format("rate").load().groupBy("value").count()
                .writeStream.format("noop").outputMode("update")
                .option("checkpointLocation", str(tmp_path / "ck")).start()
            )
    finally:
        spark.conf.unset(key)
    error = errors.state_error(failure.value)
    assert isinstance(error, errors.InvalidOptionError) and isinstance(error, ValueError)
    assert error.error_id == "KEYEDSTATE_INVALID_OPTION"
    assert str(error).startswith(f"[KEYEDSTATE_INVALID_OPTION] Invalid value 'brotli' for {key}")
    # The same fault caught in Python, before the JVM: the same class and identifier.
    with pytest.raises(errors.InvalidOptionError) as early:
        keyedstate.configure(SparkSession.builder, compression="brotli")
    assert early.value.error_id == "KEYEDSTATE_INVALID_OPTION"


def test_every_jvm_identifier_has_its_family_class(spark: SparkSession) -> None:
    """The JVM's declaration (``ErrorId.all``, in the jar this session runs) and Python's
    generated catalog agree: each identifier maps to the class its family declares, exported by
    ``keyedstate.errors``, never to the bare root; and a local-disk failure built in the JVM and
    wrapped as Spark wraps it comes out as ``LocalDiskError``."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    ids = jvm.io.keyedstate.errors.ErrorId.all()
    names = set()
    for i in range(ids.size()):
        error_id = ids.apply(i)
        name, python_class = str(error_id.name()), str(error_id.family().pythonClass())
        cls = errors.error_class(name)
        assert cls is getattr(errors, python_class) and cls is not errors.KeyedStateError, name
        assert issubclass(cls, errors.KeyedStateError) and python_class in errors.__all__, name
        names.add(name)
    assert names == set(ERROR_CLASSES)

    disk = jvm.io.keyedstate.errors.LocalDiskException(
        "Cannot write the state changelog /x/keyedstate/c.log: No space left on device",
        jvm.java.io.IOException("No space left on device"),
    )
    wrapped = jvm.org.apache.spark.SparkException("Job aborted: ...\n\tat stack", disk)
    mapped = errors.from_java(wrapped)
    assert isinstance(mapped, errors.LocalDiskError)
    assert mapped.error_id == "KEYEDSTATE_LOCAL_DISK_WRITE_FAILED"
    assert str(mapped) == (
        "[KEYEDSTATE_LOCAL_DISK_WRITE_FAILED] Cannot write the state changelog "
        "/x/keyedstate/c.log: No space left on device"
    )
    assert errors.from_java(jvm.java.lang.IllegalStateException("not ours")) is None


def test_identifiers_this_version_does_not_know_map_by_their_family() -> None:
    """An identifier from a newer jar gets the class of the known ones it shares its leading words
    with; the tools' combined class of the root is ``CheckpointOperationError`` itself; the classes
    are keyedstate.errors' (as tracebacks and pickles name them); a signal needs no message."""
    assert errors.error_class("KEYEDSTATE_KAFKA_SOMETHING_NEW") is errors.KafkaSinkError
    assert errors.error_class("KEYEDSTATE_CHECKPOINT_SOMETHING_NEW") is errors.CheckpointError
    assert errors.error_class("KEYED_FUNCTION_SOMETHING_NEW") is errors.KeyedFunctionError
    assert errors.error_class("SOMETHING_ELSE") is errors.KeyedStateError
    assert errors._operation_class(errors.KeyedStateError) is errors.CheckpointOperationError
    assert issubclass(errors._operation_class(errors.RescaleError), errors.CheckpointOperationError)
    for cls in set(ERROR_CLASSES.values()) | {errors.KeyedStateError}:
        assert cls.__module__ == "keyedstate.errors", cls
    assert str(errors.BatchAlreadyCommitted()) == ""
