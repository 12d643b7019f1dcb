"""A transactional Kafka sink for ``foreachBatch``: exactly once for ``read_committed`` readers.

Each partition of a micro-batch (a Spark task) writes through one transactional producer whose
``transactional.id`` is ``keyedstate-<sink id>-<partition>``: a restarted or speculative attempt
of the same partition calls ``init_transactions`` with the same id, which fences the older
producer and aborts its open transaction. The batch id is committed in the same transaction, as
the offset of a per-(sink, partition) consumer group (``send_offsets_to_transaction``), so the
records and the "batch N done" mark become visible together or not at all; a replayed batch
whose mark is there is skipped, one whose transaction did not commit is written again.

The ``confluent-kafka`` client (``pip install 'keyedstate[kafka]'``) is imported only when a sink
is made. Guarantees and limits: docs/exactly-once.md, "Kafka sink".
"""

from __future__ import annotations

import copy
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from keyedstate.sinks.two_phase_commit import (
    QUERY_ID_PROPERTY,
    BatchAlreadyCommitted,
    TransactionContext,
    TransactionScope,
    TwoPhaseCommitSink,
)

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError, Producer
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["KafkaSink", "KafkaSinkError", "KafkaTransaction", "kafka"]

LOG = logging.getLogger(__name__)
# librdkafka's own log lines go to Python logging, not straight to the executors' stderr.
CLIENT_LOG = logging.getLogger(__name__ + ".client")

ID_PREFIX = "keyedstate-"
# The marker offset lives on this partition of the output topic (every topic has a partition 0;
# the broker refuses offsets for partitions that do not exist).
MARKER_PARTITION = 0
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Spark's own Kafka sink's columns (its `topic` column aside: this sink writes one topic).
COLUMN_TYPES = {
    "key": ("string", "binary"),
    "value": ("string", "binary"),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


class KafkaSinkError(RuntimeError):
    """A Kafka sink cannot write: bad configuration, unreachable brokers, a missing topic, a
    DataFrame that is not a Kafka record, or a transaction the broker refused."""


def _client_module() -> Any:  # noqa: ANN401 - the confluent_kafka module
    try:
        import confluent_kafka
    except ImportError as error:
        raise KafkaSinkError(
            "keyedstate.sinks.kafka needs the confluent-kafka client: "
            "pip install 'keyedstate[kafka]' (or confluent-kafka) on the driver and executors"
        ) from error
    return confluent_kafka


@dataclass
class KafkaTransaction:
    """One open Kafka transaction: a producer with its own transactional id, and the consumer
    whose group holds the committed-batch mark."""

    context: TransactionContext
    transactional_id: str
    producer: Producer
    consumer: Consumer
    errors: list[KafkaError] = field(default_factory=list)
    records: int = 0

    def on_delivery(self, error: KafkaError | None, _message: object) -> None:
        if error is not None:
            self.errors.append(error)


class KafkaSink(TwoPhaseCommitSink[KafkaTransaction]):
    """Exactly-once Kafka output of a streaming query, used as ``foreachBatch(sink)``.

    Partition scope reads each partition as Arrow batches (``partition_input``): a record costs
    a client call, not a Row object.

    The DataFrame has Spark's Kafka sink's columns: ``value`` (string or binary), optionally
    ``key`` (string or binary), ``partition`` (int) and ``headers``
    (array<struct<key:string,value:binary>>); any other column is an error. Make one with
    ``keyedstate.sinks.kafka(...)``.
    """

    partition_input = "arrow"

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
        reserved = sorted(set(config or {}) & {"bootstrap.servers", "transactional.id", "group.id"})
        if reserved:
            raise KafkaSinkError(f"config must not set {reserved}: the sink sets them")
        _client_module()  # fail here, on the driver, when the client is not installed
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.config = dict(config or {})
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
        columns = check_schema(df.schema)
        if not self._topic_checked:
            self.check_topic()
            self._topic_checked = True
        bound = copy.copy(self)  # what the tasks get: this batch's query id, no shared state
        bound._query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        TwoPhaseCommitSink.__call__(bound, df.select(*columns), batch_id)

    def check_topic(self) -> None:
        """Fail fast, naming the servers or the topic, if the brokers are unreachable or the
        topic does not exist (the sink never creates topics)."""
        ck = _client_module()
        consumer = ck.Consumer(self._client_config({"group.id": f"{ID_PREFIX}topic-check"}))
        try:
            try:
                metadata = consumer.list_topics(topic=self.topic, timeout=self.timeout_s)
            except ck.KafkaException as error:
                raise KafkaSinkError(
                    f"cannot reach Kafka at {self.bootstrap_servers} within {self.timeout_s:g}s "
                    f"({_describe(error)}): check bootstrap_servers, that the brokers are up "
                    "and that this host can connect to them"
                ) from None
            found = metadata.topics.get(self.topic)
            if (
                found is not None
                and found.error is not None
                and (found.error.code() != ck.KafkaError.UNKNOWN_TOPIC_OR_PART)
            ):
                raise KafkaSinkError(
                    f"cannot use Kafka topic {self.topic!r} on {self.bootstrap_servers}: "
                    f"{found.error.name()}: {found.error.str()}"
                )
            if found is None or found.error is not None:
                raise KafkaSinkError(
                    f"Kafka topic {self.topic!r} does not exist on {self.bootstrap_servers} "
                    f"({found.error.str() if found is not None else 'not in metadata'}): create it "
                    f"first, e.g. kafka-topics.sh --bootstrap-server {self.bootstrap_servers} "
                    f"--create --topic {self.topic} --partitions N; the sink does not create topics"
                )
        finally:
            consumer.close()

    # -- the two-phase commit ------------------------------------------------------------------

    def is_committed(self, context: TransactionContext) -> bool:
        # Only marks already committed: a zombie's pending one would make a stable read wait for
        # its transaction. begin_transaction checks again, stably, once the zombie is fenced.
        consumer = self._marker_consumer(context, stable=False)
        try:
            return self._committed_batch(consumer, context) >= context.batch_id
        finally:
            consumer.close()

    def begin_transaction(self, context: TransactionContext) -> KafkaTransaction:
        ck = _client_module()
        transactional_id = self.transactional_id(context)
        producer = ck.Producer(
            self._client_config(
                {
                    "transactional.id": transactional_id,
                    "transaction.timeout.ms": int(self.transaction_timeout_s * 1000),
                    "linger.ms": 5,
                }
            )
        )
        transaction = KafkaTransaction(
            context, transactional_id, producer, self._marker_consumer(context, stable=True)
        )
        try:
            # Fences any older producer with this id and ends its transaction: an open one is
            # aborted, one already committing completes first (so the mark below is current).
            self._call(transaction, "init_transactions", producer.init_transactions, self.timeout_s)
            if self._committed_batch(transaction.consumer, context) >= context.batch_id:
                raise BatchAlreadyCommitted(str(context))
            self._call(transaction, "begin_transaction", producer.begin_transaction)
        except BaseException:
            self._close(transaction)
            raise
        return transaction

    def invoke(self, transaction: KafkaTransaction, rows: Iterable[Any]) -> None:
        producer = transaction.producer
        for value, key, partition, headers in _records(rows):
            kwargs: dict[str, Any] = {"value": _bytes(value)}
            if key is not None:
                kwargs["key"] = _bytes(key)
            if partition is not None:
                kwargs["partition"] = partition
            if headers:
                kwargs["headers"] = [(h["key"], _bytes(h["value"])) for h in headers]
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    producer.produce(self.topic, on_delivery=transaction.on_delivery, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self._raise_delivery_errors(transaction)
                    if time.monotonic() > deadline:
                        raise KafkaSinkError(
                            f"{transaction.context}: the producer's queue stayed full for "
                            f"{self.timeout_s:g}s: {self.bootstrap_servers} does not take the "
                            "records (are the brokers up?)"
                        ) from None
                    producer.poll(0.1)
                except _client_module().KafkaException as error:
                    raise self._error(transaction, "produce", error) from None
            transaction.records += 1
            if transaction.records % 1000 == 0:
                producer.poll(0)
                self._raise_delivery_errors(transaction)

    def pre_commit(self, transaction: KafkaTransaction) -> None:
        ck = _client_module()
        remaining = transaction.producer.flush(self.timeout_s)
        self._raise_delivery_errors(transaction)
        if remaining:
            raise KafkaSinkError(
                f"{transaction.context}: {remaining} record(s) not acknowledged by "
                f"{self.bootstrap_servers} within {self.timeout_s:g}s: are the brokers up? The "
                "transaction is aborted; the batch's replay writes it once"
            )
        mark = json.dumps(
            {
                "sink": transaction.context.sink_id,
                "query": self._query_id,
                "batch": transaction.context.batch_id,
                "partition": transaction.context.partition_id,
                "records": transaction.records,
            },
            sort_keys=True,
        )
        offsets = [
            ck.TopicPartition(self.topic, MARKER_PARTITION, transaction.context.batch_id, mark)
        ]
        self._call(
            transaction,
            "send_offsets_to_transaction",
            transaction.producer.send_offsets_to_transaction,
            offsets,
            transaction.consumer.consumer_group_metadata(),
            self.timeout_s,
        )

    def commit(self, transaction: KafkaTransaction) -> None:
        # A retriable failure (a timeout) leaves the commit in progress: retrying it is allowed
        # and finds its outcome; anything else is the template's to abort.
        for attempt in range(3):
            try:
                transaction.producer.commit_transaction(self.timeout_s)
                break
            except _client_module().KafkaException as error:
                if attempt == 2 or not error.args[0].retriable():
                    raise self._error(transaction, "commit_transaction", error) from None
                LOG.warning(
                    "%s: commit_transaction: %s; retrying", transaction.context, _describe(error)
                )
        LOG.info(
            "%s: committed %d record(s) to %s", transaction.context, transaction.records, self.topic
        )
        self._close(transaction)

    def abort(self, transaction: KafkaTransaction) -> None:
        try:
            self._call(
                transaction,
                "abort_transaction",
                transaction.producer.abort_transaction,
                self.timeout_s,
            )
        finally:
            self._close(transaction)

    # -- helpers -------------------------------------------------------------------------------

    def _client_config(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **self.config,
            "bootstrap.servers": self.bootstrap_servers,
            "logger": CLIENT_LOG,
            **extra,
        }

    def _marker_consumer(self, context: TransactionContext, stable: bool) -> Consumer:
        """A client of the mark's group. ``stable``: its reads wait for the group's pending
        transactional offsets to be committed or aborted (KIP-447), so they are current."""
        return _client_module().Consumer(
            self._client_config(
                {
                    "group.id": self.marker_group(context),
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed" if stable else "read_uncommitted",
                    "allow.auto.create.topics": False,
                }
            )
        )

    def _committed_batch(self, consumer: Consumer, context: TransactionContext) -> int:
        """The last batch id committed for ``context``'s (sink, partition); -1 if none."""
        ck = _client_module()
        try:
            (mark,) = consumer.committed(
                [ck.TopicPartition(self.topic, MARKER_PARTITION)], timeout=self.timeout_s
            )
        except ck.KafkaException as error:
            raise KafkaSinkError(
                f"{context}: cannot read the committed-batch mark of group "
                f"{self.marker_group(context)!r} from {self.bootstrap_servers} within "
                f"{self.timeout_s:g}s ({_describe(error)})"
            ) from None
        if mark.error is not None:
            raise KafkaSinkError(
                f"{context}: reading the mark of group {self.marker_group(context)!r}: {mark.error}"
            )
        if mark.offset < 0:
            return -1
        self._check_mark_owner(mark.metadata, mark.offset, context)
        return int(mark.offset)

    def _check_mark_owner(
        self, metadata: str | None, batch: int, context: TransactionContext
    ) -> None:
        """Spark only ever replays its last batch, so a mark past it, or one of another query at
        it, means the checkpoint was reset or restored, or another query writes with this
        sink_id: skipping would silently drop batches this query never wrote, so refuse."""
        try:
            owner = json.loads(metadata or "{}").get("query")
        except ValueError:
            owner = None
        other_query = bool(owner and self._query_id and owner != self._query_id)
        if batch > context.batch_id or (batch == context.batch_id and other_query):
            raise KafkaSinkError(
                f"{context}: sink_id {context.sink_id!r} already committed batch {batch} "
                f"(query {owner or 'unknown'}) on topic {self.topic!r}; this query "
                f"({self._query_id or 'unknown'}) would skip batch {context.batch_id} without "
                "writing it. The checkpoint was reset or restored from an older copy, or another "
                "query uses this sink_id: give this query its own sink_id, or restart it from the "
                "checkpoint that wrote the later batch"
            )

    def _call(
        self, transaction: KafkaTransaction, what: str, method: Callable[..., Any], *args: Any
    ) -> Any:  # noqa: ANN401 - whatever the client returns
        try:
            return method(*args)
        except _client_module().KafkaException as error:
            raise self._error(transaction, what, error) from None

    def _error(self, transaction: KafkaTransaction, what: str, error: Exception) -> KafkaSinkError:
        ck = _client_module()
        kafka_error = error.args[0] if error.args else None
        fenced = isinstance(kafka_error, ck.KafkaError) and kafka_error.code() in (
            ck.KafkaError._FENCED,
            ck.KafkaError.PRODUCER_FENCED,
            ck.KafkaError.INVALID_PRODUCER_EPOCH,
        )
        why = (
            "fenced by a newer attempt of the same partition (this attempt is a zombie: its "
            "records are discarded)"
            if fenced
            else _describe(error)
        )
        return KafkaSinkError(
            f"{transaction.context}: {what} on {self.bootstrap_servers} (transactional.id "
            f"{transaction.transactional_id!r}, topic {self.topic!r}) failed: {why}"
        )

    def _raise_delivery_errors(self, transaction: KafkaTransaction) -> None:
        if transaction.errors:
            first = transaction.errors[0]
            raise KafkaSinkError(
                f"{transaction.context}: {len(transaction.errors)} record(s) not written to "
                f"topic {self.topic!r} on {self.bootstrap_servers}: {first.name()}: {first.str()}"
            )

    def _close(self, transaction: KafkaTransaction) -> None:
        for client in (transaction.consumer, transaction.producer):
            try:
                client.close()
            except Exception:  # already closed, or the broker is gone: nothing to keep
                LOG.debug("%s: closing a client failed", transaction.context, exc_info=True)


def check_schema(schema: StructType) -> list[str]:
    """The DataFrame's Kafka columns in order, or a ``KafkaSinkError`` naming what is wrong."""
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    problems = [f"unknown column {name!r}" for name in types if name not in COLUMN_TYPES]
    if "value" not in types:
        problems.append("no 'value' column")
    problems += [
        f"column {name!r} is {kind}, must be {' or '.join(COLUMN_TYPES[name])}"
        for name, kind in types.items()
        if name in COLUMN_TYPES and kind not in COLUMN_TYPES[name]
    ]
    if problems:
        raise KafkaSinkError(
            f"the DataFrame does not fit a Kafka record ({'; '.join(problems)}); it has columns "
            f"{', '.join(f'{n}: {t}' for n, t in types.items()) or 'none'}. Expected: value "
            "(string or binary), optional key (string or binary), partition (int), headers "
            "(array<struct<key:string,value:binary>>): select or cast, e.g. "
            "df.selectExpr('CAST(id AS STRING) AS key', 'to_json(struct(*)) AS value')"
        )
    return [name for name in COLUMN_TYPES if name in types]


def _records(rows: Iterable[Any]) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(value, key, partition, headers) of each record, from Arrow batches (partition scope) or
    pyspark Rows (batch scope)."""
    for item in rows:
        if isinstance(item, pa.RecordBatch):
            columns = item.to_pydict()
            none = [None] * item.num_rows
            yield from zip(
                columns["value"],
                columns.get("key", none),
                columns.get("partition", none),
                columns.get("headers", none),
                strict=True,
            )
        else:
            fields = item.asDict()
            yield fields["value"], fields.get("key"), fields.get("partition"), fields.get("headers")


def _bytes(value: object) -> bytes | str | None:
    """A Row's key or value as the client takes it (Spark's binary arrives as bytearray)."""
    if value is None or isinstance(value, (bytes, str)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise KafkaSinkError(f"a Kafka key or value must be string or binary, got {type(value)}")


def _describe(error: Exception) -> str:
    kafka_error = error.args[0] if error.args else None
    if hasattr(kafka_error, "name") and hasattr(kafka_error, "str"):
        return f"{kafka_error.name()}: {kafka_error.str()}"
    return str(error)


def kafka(
    topic: str,
    bootstrap_servers: str,
    *,
    sink_id: str | None = None,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
    transaction_timeout_s: float = 60.0,
    scope: TransactionScope | str = TransactionScope.PARTITION,
) -> KafkaSink:
    """An exactly-once Kafka sink for ``df.writeStream.foreachBatch(...)``.

    - ``topic``, ``bootstrap_servers`` (``"host:port,..."``): where to write; the topic must
      exist (the sink never creates topics).
    - ``sink_id``: the stable name of this output; default the streaming query's id, which the
      checkpoint keeps. Transactional ids and the committed-batch groups derive from it.
    - ``config``: extra librdkafka settings for its clients (security, ``compression.type``...).
    - ``timeout_s``: bound on every blocking broker call (metadata, init, flush, commit).
    - ``transaction_timeout_s``: the broker aborts a transaction open longer than this; it must
      exceed the longest task's write and not exceed the broker's ``transaction.max.timeout.ms``.
    - ``scope``: ``"partition"`` (one transaction per task, the default) or ``"batch"`` (one
      transaction per micro-batch on the driver: a batch becomes visible all at once, but its
      rows pass through the driver).
    """
    return KafkaSink(
        topic,
        bootstrap_servers,
        sink_id=sink_id,
        config=config,
        timeout_s=timeout_s,
        transaction_timeout_s=transaction_timeout_s,
        scope=scope,
    )
