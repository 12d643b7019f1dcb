"""A throwaway Apache Kafka broker for the tests: KRaft mode (no ZooKeeper), one node that is both
controller and broker, on 127.0.0.1 with free ports and a fresh log directory.

The jars come from Maven Central through ``make connectors`` (dev/connectors/kafka-broker/pom.xml,
copied to build/connectors/kafka-broker/); ``KEYEDSTATE_KAFKA_JARS`` points at another directory
of them. The broker's own log goes to ``broker.log`` in its directory.

``kill()`` SIGKILLs it for outage tests; ``start()`` brings it back on the same ports and log
directory (so clients' bootstrap address stays valid). Topics are created, and test records
produced and read, with the ``confluent-kafka`` client (the ``test`` extra).
"""

from __future__ import annotations

import atexit
import base64
import logging
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.support.paths import REPO
from tests.support.servers.ports import free_port, java_executable, maven_jars
from tests.support.servers.processes import DaemonServer

JARS_DIR = REPO / "build" / "connectors" / "kafka-broker"
START_TIMEOUT_S = 60.0
CLIENT_LOG = logging.getLogger("keyedstate.tests.kafka_client")

# Small and quick for one node: single-partition internal topics, no rebalance delay, topics
# only created on purpose (a missing topic must stay missing in the tests).
BROKER_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    # A restarted broker re-registers only once its old session expired (default 9s).
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    "auto.create.topics.enable": "false",
    "log.flush.interval.messages": "9223372036854775807",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "log.cleaner.enable": "false",
}

LOG4J = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.org.apache.kafka.storage.internals.log=WARN
log4j.logger.kafka.log.LogCleaner=WARN
"""


def broker_jars_dir() -> Path:
    """The directory of the broker's jars; a clear error naming the make target if missing."""
    return maven_jars(
        "KEYEDSTATE_KAFKA_JARS", JARS_DIR, "kafka_2.13-*.jar",
        "kafka_2.13 and its dependencies", "Kafka broker",
    )


class KafkaBroker(DaemonServer):
    """One single-node KRaft Kafka broker in its own temporary directory; ``close()`` stops it
    and removes the directory."""

    NAME = "Kafka broker"
    STOP_SIGNAL = signal.SIGTERM  # a controlled shutdown
    STOP_TIMEOUT_S = 20.0
    START_TIMEOUT_S = START_TIMEOUT_S

    def __init__(self, heap: str = "384m") -> None:
        self.jars_dir = broker_jars_dir()
        self.java = java_executable("the Kafka broker")
        self.heap = heap
        self.host = "127.0.0.1"
        self.port = free_port()
        self.controller_port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="keyedstate-kafka-"))
        self.data_dir = self.root / "data"
        self.config_path = self.root / "server.properties"
        self.log_path = self.root / "broker.log"
        self.process: subprocess.Popen[bytes] | None = None
        atexit.register(self.close)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    # -- life cycle ------------------------------------------------------------------------------

    def _write_config(self) -> None:
        settings = {
            **BROKER_SETTINGS,
            "listeners": (
                f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap_servers}",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "log.dirs": str(self.data_dir),
        }
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.root / "log4j.properties").write_text(LOG4J)

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            self.java,
            f"-Xmx{self.heap}",
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # starts sooner; a test broker never gets hot
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.root / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.root}",
            "-cp",
            f"{self.jars_dir}/*",
            main,
            *args,
        ]

    def _prepare(self) -> None:
        """Format the KRaft log directory with a new cluster id (``kafka-storage.sh format``)."""
        self._write_config()
        # As Kafka's own Uuid.randomUuid: an id starting with '-' reads as an option (1 in 64).
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        done = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                       str(self.config_path)),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"formatting Kafka storage in {self.data_dir} failed ({done.returncode}): "
                f"{(done.stdout + done.stderr).strip()[-2000:]}"
            )

    def _run(self) -> None:
        """Start the broker and wait until it serves metadata."""
        self._launch(self._java("kafka.Kafka", str(self.config_path)), stdin=subprocess.DEVNULL)
        self._wait_ready(self._serves_metadata, Exception, 0.2, self.bootstrap_servers)

    def _serves_metadata(self) -> bool:
        from confluent_kafka.admin import AdminClient

        with socket.create_connection((self.host, self.port), timeout=1):
            pass
        return bool(AdminClient(self.client_config()).list_topics(timeout=5).brokers)

    def restart(self) -> None:
        """Kill and start again on the same ports and data (an outage of a few seconds)."""
        self.kill()
        self.start()

    # -- topics and records ----------------------------------------------------------------------

    def client_config(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """confluent-kafka settings for a client of this broker; its log goes to Python logging
        (not stderr, where a killed broker's reconnect attempts would flood the test output)."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "logger": CLIENT_LOG,
            **(extra or {}),
        }

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> str:
        """Create ``name`` (replication 1) and wait until it is there; returns the name."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.client_config())
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1,
                         config=dict(config or {}))
        futures = admin.create_topics([topic], operation_timeout=30, request_timeout=30)
        futures[name].result(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = admin.list_topics(topic=name, timeout=5).topics.get(name)
            if found is not None and found.error is None and len(found.partitions) == partitions:
                return name
            time.sleep(0.1)
        raise RuntimeError(f"topic {name!r} not visible on {self.bootstrap_servers} after 30s")

    def produce(
        self,
        topic: str,
        records: Iterable[tuple[bytes | str | None, bytes | str | None]],
        partition: int | None = None,
    ) -> None:
        """Write ``(key, value)`` records (plain, non-transactional) and wait for the acks."""
        from confluent_kafka import Producer

        errors: list[Any] = []
        producer = Producer(self.client_config({"linger.ms": 5}))
        for key, value in records:
            extra = {} if partition is None else {"partition": partition}
            producer.produce(
                topic, key=key, value=value,
                on_delivery=lambda err, _msg: err and errors.append(err), **extra,
            )
            producer.poll(0)
        remaining = producer.flush(30)
        if remaining or errors:
            raise RuntimeError(f"producing to {topic!r}: {remaining} unsent, errors {errors[:3]}")

    def read(
        self, topic: str, isolation_level: str = "read_committed", timeout_s: float = 30.0
    ) -> list[tuple[int, bytes | None, bytes | None]]:
        """Every record of ``topic`` visible at ``isolation_level``, as (partition, key, value),
        in partition then offset order. Reads up to each partition's end (its last stable offset
        for read_committed: so wait for open transactions to end before calling)."""
        return [(p, k, v) for p, k, v, _ in self.read_records(topic, isolation_level, timeout_s)]

    def read_records(
        self, topic: str, isolation_level: str = "read_committed", timeout_s: float = 30.0
    ) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
        """As ``read``, with each record's headers as a fourth element."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            self.client_config(
                {
                    "group.id": f"keyedstate-test-reader-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": isolation_level,
                    "enable.partition.eof": True,
                }
            )
        )
        try:
            metadata = consumer.list_topics(topic=topic, timeout=10).topics[topic]
            if metadata.error is not None:
                raise RuntimeError(f"cannot read topic {topic!r}: {metadata.error}")
            partitions = sorted(metadata.partitions)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
            records: dict[int, list[Any]] = {}
            at_end: set[int] = set()
            deadline = time.monotonic() + timeout_s
            while len(at_end) < len(partitions):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"reading {topic!r}: partitions {sorted(set(partitions) - at_end)} did "
                        f"not reach their end in {timeout_s}s"
                    )
                message = consumer.poll(0.2)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == error._PARTITION_EOF:
                        at_end.add(message.partition())
                        continue
                    raise RuntimeError(f"reading {topic!r}: {error}")
                at_end.discard(message.partition())
                records.setdefault(message.partition(), []).append(
                    (message.partition(), message.key(), message.value(), message.headers() or [])
                )
            return [r for p in partitions for r in records.get(p, [])]
        finally:
            consumer.close()
