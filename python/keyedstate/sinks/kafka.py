"""A transactional Kafka sink for ``foreachBatch``: exactly once for ``read_committed`` readers.

Each partition of a micro-batch (a Spark task) writes through one transactional producer whose
``transactional.id`` is ``keyedstate-<sink id>-<partition>``: a restarted or speculative attempt
of the same partition calls ``initTransactions`` with the same id, which fences the older
producer and aborts its open transaction. The batch id is committed in the same transaction, as
the offset of a per-(sink, partition) consumer group (``sendOffsetsToTransaction``), so the
records and the "batch N done" mark become visible together or not at all; a replayed batch
whose mark is there is skipped, one whose transaction did not commit is written again.

The writing runs in the JVM (``io.keyedstate.sinks``, on ``kafka-clients``): this module checks
the arguments and hands the batch's DataFrame over, so rows go from Spark to the producer
without Python in between. The client comes with Spark's Kafka connector
(``keyedstate.configure(builder, kafka=True)``). Guarantees and limits: docs/exactly-once.md,
"Kafka sink".
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyedstate.errors import (
    BatchAlreadyCommitted,
    KafkaSinkError,
    error_class,
    first_line,
    java_causes,
    keyedstate_cause,
    state_error,
)
from keyedstate.sinks.two_phase_commit import (
    QUERY_ID_PROPERTY,
    TransactionContext,
    TransactionScope,
    TwoPhaseCommitSink,
)
from keyedstate.spark_connect import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

__all__ = ["KafkaSink", "KafkaSinkError", "KafkaTransaction", "kafka"]

ID_PREFIX = "keyedstate-"
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# The sink sets these itself (the mark's group is not a client setting: it is the
# transactional id).
RESERVED_CONFIG = {
    "bootstrap.servers",
    "transactional.id",
    "group.id",
    "key.serializer",
    "value.serializer",
}
# A Connect error's text saying the server has no Kafka client (its message or stack trace).
_MISSING_KAFKA_CLASS = re.compile(
    r"(?:NoClassDefFoundError|ClassNotFoundException)\)?:? *org[./]apache[./]kafka"
)
_CONNECTOR_HINT = (
    "the Kafka sink needs kafka-clients on Spark's classpath: build the session with "
    "keyedstate.configure(builder, kafka=True), which adds Spark's Kafka connector and its client"
)


@dataclass
class KafkaTransaction:
    """One open Kafka transaction, begun on the driver by ``KafkaSink.begin_transaction``: a
    handle on the JVM's ``io.keyedstate.sinks.KafkaTransaction``."""

    context: TransactionContext
    transactional_id: str
    handle: Any  # a py4j JavaObject


class KafkaSink(TwoPhaseCommitSink[KafkaTransaction]):
    """An exactly-once Kafka sink for ``df.writeStream.foreachBatch(sink)``; make one with
    ``keyedstate.sinks.kafka(...)`` (this class).

    - ``topic``, ``bootstrap_servers`` (``"host:port,..."``): where to write; the topic must
      exist (the sink never creates topics).
    - ``sink_id``: the stable name of this output; default the streaming query's id, which the
      checkpoint keeps. Transactional ids and the committed-batch groups derive from it.
    - ``config``: extra Kafka client settings (``kafka-clients``' producer settings: security,
      ``compression.type``, ``linger.ms``...; the admin client that reads the marks gets those
      it knows).
    - ``timeout_s``: bound on every blocking broker call (metadata, init, flush, commit).
    - ``transaction_timeout_s``: the broker aborts a transaction open longer than this; it must
      exceed the longest task's write and not exceed the broker's ``transaction.max.timeout.ms``.
    - ``scope``: ``"partition"`` (one transaction per task, the default) or ``"batch"`` (one
      transaction per micro-batch on the driver: a batch becomes visible all at once, but its
      rows pass through the driver).

    The DataFrame has Spark's Kafka sink's columns: ``value`` (string or binary), optionally
    ``key`` (string or binary), ``partition`` (int) and ``headers``
    (array<struct<key:string,value:binary>>); any other column is an error.

    Calling the sink writes the batch in the JVM (``io.keyedstate.sinks.KafkaSinkWriter``),
    in either scope. The two-phase-commit steps (``begin_transaction``, ``invoke``, ...) run the
    same JVM transaction on the driver, one step at a time: for tools and tests.
    """

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str,
        *,
        sink_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
        transaction_timeout_s: float = 60.0,
        scope: TransactionScope | str = TransactionScope.PARTITION,
    ) -> None:
        super().__init__(sink_id)
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
            raise KafkaSinkError(
                f"bootstrap_servers must be 'host:port[,host:port...]', got {bootstrap_servers!r}"
            )
        if not isinstance(topic, str) or not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            raise KafkaSinkError(
                f"invalid Kafka topic name {topic!r}: 1 to 249 of a-z A-Z 0-9 . _ -"
            )
        if sink_id is not None and (not isinstance(sink_id, str) or not sink_id.strip()):
            raise KafkaSinkError(f"sink_id must be a non-empty string or None, got {sink_id!r}")
        for name, value in (
            ("timeout_s", timeout_s),
            ("transaction_timeout_s", transaction_timeout_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise KafkaSinkError(f"{name} must be a positive number of seconds, got {value!r}")
        try:
            self.scope = TransactionScope(scope)
        except ValueError:
            raise KafkaSinkError(f"scope must be 'partition' or 'batch', got {scope!r}") from None
        reserved = sorted(set(config or {}) & RESERVED_CONFIG)
        if reserved:
            raise KafkaSinkError(f"config must not set {reserved}: the sink sets them")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.config = {str(k): _config_value(v) for k, v in (config or {}).items()}
        self.timeout_s = float(timeout_s)
        self.transaction_timeout_s = float(transaction_timeout_s)
        self._query_id: str | None = None  # of the running query, for the mark's metadata
        self._topic_checked = False

    # -- identities --------------------------------------------------------------------------

    def transactional_id(self, context: TransactionContext) -> str:
        """``keyedstate-<sink id>-<partition>`` (``-batch`` for batch scope): the same for every
        attempt at the same partition, so a new attempt fences the old one."""
        part = "batch" if context.partition_id is None else str(context.partition_id)
        return f"{ID_PREFIX}{context.sink_id}-{part}"

    def marker_group(self, context: TransactionContext) -> str:
        """The consumer group whose committed offset is the last batch this partition wrote."""
        return self.transactional_id(context)

    # -- foreachBatch entry point --------------------------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if is_connect(df):
            self._write_on_connect(df, batch_id)
            return
        bound = copy.copy(self)  # this batch's query id, without changing the user's sink
        bound._query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        sink_id = self.sink_id_for(df)
        writer = _jvm_sinks(df.sparkSession).KafkaSinkWriter
        _call(
            f"writing batch {batch_id} to Kafka topic {self.topic!r}",
            writer.write,
            df._jdf,
            batch_id,
            bound._settings(sink_id),
            not self._topic_checked,
        )
        self._topic_checked = True

    def _write_on_connect(self, df: DataFrame, batch_id: int) -> None:
        """The batch from a Connect client's ``foreachBatch`` (run in the server's Python
        process): the server's ``sink.kafka.write`` operation writes it, as ``KafkaSinkWriter``
        writes a classic session's batch."""
        from pyspark.errors import PySparkException

        from keyedstate.spark_connect import relations

        what = f"writing batch {batch_id} to Kafka topic {self.topic!r}"
        # The query's id (the marks' metadata) is not visible to foreachBatch on Connect.
        arguments = [batch_id, self._settings_fields(self.sink_id_for(df)), not self._topic_checked]
        try:
            relations.operation(df.sparkSession, "sink.kafka.write", arguments, {"batch": df})
        except PySparkException as error:
            mapped = state_error(error)
            if isinstance(mapped, (KafkaSinkError, BatchAlreadyCommitted)):
                raise mapped from None
            text = str(error)
            first = text.splitlines()[0] if text else ""
            if _MISSING_KAFKA_CLASS.search(text):
                hint = f"{what}: {_CONNECTOR_HINT} on the Connect server ({first})"
                raise KafkaSinkError(hint) from None
            raise KafkaSinkError(f"{what} failed: {first}") from error
        self._topic_checked = True

    def check_topic(self) -> None:
        """Fail fast, naming the servers or the topic, if the brokers are unreachable or the
        topic does not exist (the sink never creates topics)."""
        jvm = _jvm_sinks()
        _call("checking the topic", jvm.KafkaSinkWriter.checkTopic, self._settings("check"))

    # -- the two-phase commit, step by step on the driver -------------------------------------

    def is_committed(self, context: TransactionContext) -> bool:
        # Only marks already committed: a zombie's pending one would make a stable read wait for
        # its transaction. begin_transaction checks again, stably, once the zombie is fenced.
        batch = self._step(context, "reading the committed-batch mark", "committedBatch")
        return int(batch) >= context.batch_id

    def begin_transaction(self, context: TransactionContext) -> KafkaTransaction:
        handle = self._step(context, "beginning a transaction", "begin")
        return KafkaTransaction(context, self.transactional_id(context), handle)

    def _step(self, context: TransactionContext, what: str, method: str) -> Any:  # noqa: ANN401
        """A KafkaSinkWriter step for ``context``'s (sink, batch, partition), errors mapped."""
        writer = _jvm_sinks().KafkaSinkWriter
        args = (self._settings(context.sink_id), context.batch_id, _partition(context))
        return _call(f"{context}: {what}", getattr(writer, method), *args)

    def invoke(self, transaction: KafkaTransaction, rows: Iterable[Row]) -> None:
        for row in rows:
            fields = row.asDict()
            headers = fields.get("headers")
            _call(
                f"{transaction.context}: send",
                transaction.handle.send,
                _bytes(fields.get("key")),
                _bytes(fields["value"]),
                fields.get("partition"),
                [[h["key"], _bytes(h["value"])] for h in headers] if headers else None,
            )

    def pre_commit(self, transaction: KafkaTransaction) -> None:
        _call(f"{transaction.context}: pre-commit", transaction.handle.preCommit)

    def commit(self, transaction: KafkaTransaction) -> None:
        _call(f"{transaction.context}: commit", transaction.handle.commit)

    def abort(self, transaction: KafkaTransaction) -> None:
        _call(f"{transaction.context}: abort", transaction.handle.abort)

    # -- helpers -------------------------------------------------------------------------------

    def _settings_fields(self, sink_id: str) -> dict[str, Any]:
        """This sink's settings, by the names of the JVM's ``KafkaSinkSettings.create``
        arguments, in their order (a Connect server's ``sink.kafka.write`` reads them so)."""
        return {
            "topic": self.topic,
            "bootstrapServers": self.bootstrap_servers,
            "sinkId": sink_id,
            "queryId": self._query_id,
            "config": self.config,
            "timeoutMs": round(self.timeout_s * 1000),
            "transactionTimeoutMs": round(self.transaction_timeout_s * 1000),
            "scope": self.scope.value,
        }

    def _settings(self, sink_id: str) -> Any:  # noqa: ANN401 - a py4j JavaObject
        """This sink as the JVM's ``KafkaSinkSettings``."""
        return _jvm_sinks().KafkaSinkSettings.create(*self._settings_fields(sink_id).values())


# -- the JVM side ------------------------------------------------------------------------------


def _jvm_sinks(spark: Any = None) -> Any:  # noqa: ANN401 - a SparkSession; a py4j JavaPackage
    """The ``io.keyedstate.sinks`` package of the session's JVM."""
    from py4j.java_gateway import JavaClass
    from pyspark.sql import SparkSession

    session = spark or SparkSession.getActiveSession()
    if session is None:
        raise KafkaSinkError("the Kafka sink needs an active SparkSession: it writes in the JVM")
    package = session._jvm.io.keyedstate.sinks  # type: ignore[attr-defined]
    if not isinstance(package.KafkaSinkWriter, JavaClass):
        raise KafkaSinkError(
            "the keyedstate jar is not on Spark's classpath: build the session with "
            "keyedstate.configure(builder, kafka=True)"
        )
    return package


def _call(what: str, method: Callable[..., Any], *args: Any) -> Any:  # noqa: ANN401
    """``method(*args)`` in the JVM; its failure as ``jvm_error`` maps it."""
    from py4j.protocol import Py4JJavaError

    try:
        return method(*args)
    except Py4JJavaError as error:
        mapped, complete = jvm_error(what, error.java_exception)
        # The sink's own message says it all; anything else keeps the JVM's trace as its cause.
        raise mapped from (None if complete else error)


def jvm_error(
    what: str,
    throwable: Any,  # noqa: ANN401 - a py4j JavaObject (a Throwable)
) -> tuple[KafkaSinkError | BatchAlreadyCommitted, bool]:
    """The one place JVM failures of the sink become Python errors, with one line naming what
    failed, and whether that line is complete: the sink's own message (a ``KEYEDSTATE_KAFKA_*``
    error, found among Spark's wrappers of a failed task, ``keyedstate.errors``);
    ``BatchAlreadyCommitted`` for the JVM's signal of it; a missing Kafka client says how to
    add it; anything else is ``what`` failed, with the innermost cause's first line (Spark's
    job failures embed executor stack traces in their messages: never shown)."""
    ours = keyedstate_cause(throwable)
    if ours is not None:
        error_id = str(ours.errorId())
        cls = error_class(error_id)
        if cls is BatchAlreadyCommitted:
            return BatchAlreadyCommitted(str(ours.detail()), error_id), True
        if cls is KafkaSinkError:
            return KafkaSinkError(first_line(ours), error_id), True
    chain = java_causes(throwable)
    for error in chain:
        name = str(error.getClass().getName())
        if name in ("java.lang.NoClassDefFoundError", "java.lang.ClassNotFoundException") and (
            "org/apache/kafka" in first_line(error) or "org.apache.kafka" in first_line(error)
        ):
            return KafkaSinkError(f"{what}: {_CONNECTOR_HINT} ({first_line(error)})"), True
    innermost = chain[-1]
    message = f"{what} failed: {innermost.getClass().getSimpleName()}: {first_line(innermost)}"
    return KafkaSinkError(message), False


def _partition(context: TransactionContext) -> int:
    return -1 if context.partition_id is None else context.partition_id


def _bytes(value: object) -> bytes | None:
    """A Row's key or value as the JVM takes it: bytes (strings as UTF-8)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise KafkaSinkError(f"a Kafka key or value must be string or binary, got {type(value)}")


def _config_value(value: object) -> str:
    """A client setting as the Java client takes it: a string (booleans lower case)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


# The name users call (``keyedstate.sinks.kafka(...)``, beside the ``sinks.postgres(...)``
# function) is the class itself, so its signature and defaults are written once.
kafka = KafkaSink
