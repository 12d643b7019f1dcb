"""Checkpoints on remote storage (HDFS, S3) in the tests: what the two test servers share, and
how a running SparkSession is pointed at one of them.

A SparkSession reads ``spark.hadoop.*`` only when it starts, and the suite shares one session
that may start before a storage fixture. Hadoop settings are therefore applied at run time, on
both places Spark and keyedstate build Hadoop configurations from: the session's SQL
configuration (copied into every ``sessionState.newHadoopConf()``: streaming checkpoints and
state stores) and the SparkContext's ``hadoopConfiguration`` (keyedstate's rescale and
inspect). A subprocess driver gets them through ``HADOOP_CONF_ENV`` instead.
"""

from __future__ import annotations

import json
from typing import Protocol

from pyspark.sql import SparkSession

from tests.support.streaming_harness import HADOOP_CONF_ENV


class RemoteStorage(Protocol):
    """tests/support/servers/hdfs_cluster.py's HdfsCluster and
    tests/support/servers/s3_endpoint.py's S3Endpoint."""

    def uri(self, path: str) -> str: ...

    def hadoop_settings(self) -> dict[str, str]: ...

    def list_names(self, uri: str) -> list[str]: ...


def apply_hadoop_settings(spark: SparkSession, settings: dict[str, str]) -> None:
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in settings.items():
        spark.conf.set(key, value)
        hadoop_conf.set(key, value)


def driver_env(storage: RemoteStorage) -> dict[str, str]:
    """Environment entries that give a subprocess driver's session the storage's settings."""
    return {HADOOP_CONF_ENV: json.dumps(storage.hadoop_settings())}


def numbered(names: list[str]) -> list[int]:
    return sorted(int(n) for n in names if n.isdigit())


def committed_batches(storage: RemoteStorage, checkpoint: str) -> list[int]:
    """Batch ids with a commit log entry (streaming_harness.committed_batches, remotely)."""
    return numbered(storage.list_names(f"{checkpoint.rstrip('/')}/commits"))


def planned_batches(storage: RemoteStorage, checkpoint: str) -> list[int]:
    """Batch ids with an offset log entry (streaming_harness.planned_batches, remotely)."""
    return numbered(storage.list_names(f"{checkpoint.rstrip('/')}/offsets"))
