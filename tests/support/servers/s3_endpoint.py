"""An S3-compatible endpoint on 127.0.0.1 for the storage tests: moto's server (the ``test``
extra, ``moto[server]``) in its own process (tests/support/servers/s3_server.py), with one bucket.

Spark reaches it through Hadoop's s3a connector (jars from ``make storage``, added to the tests'
SparkSession by ``streaming_harness.session_builder``), path-style, over plain HTTP, with
``hadoop_settings()``. ``stop()`` takes the endpoint down (connections refused and reset) and
``restart()`` brings it back on the same port with every object intact, for outage tests;
``stop_on_request(regex)`` takes it down when a request line matches (mid-batch, at a chosen
upload) and ``await_stopped()`` waits for that; ``close()`` ends the process.
"""

from __future__ import annotations

import atexit
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO
from tests.support.servers.ports import free_port
from tests.support.servers.processes import LineServer

S3A_JARS = REPO / "build" / "storage" / "s3a"
SERVER = Path(__file__).resolve().parent / "s3_server.py"
START_TIMEOUT_S = 60.0
ACCESS_KEY = "keyedstate-test"
SECRET_KEY = "keyedstate-test-secret"
REGION = "us-east-1"
# The fixed keys above, not the AWS default chain (environment, profiles, instance metadata).
CREDENTIALS_PROVIDER = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"


def s3a_jars() -> list[Path]:
    """hadoop-aws and the AWS SDK parts it needs; a clear error naming the make target if
    they are missing."""
    jars = sorted(S3A_JARS.glob("*.jar"))
    if not any(j.name.startswith("hadoop-aws-") for j in jars):
        raise RuntimeError(
            f"s3a jars not found in {S3A_JARS}: run `make storage` (Maven fetches them from Maven "
            "Central as listed in dev/storage/s3a/pom.xml)"
        )
    return jars


class S3Endpoint(LineServer):
    """moto's S3 server on a free port of 127.0.0.1, with ``bucket`` created."""

    NAME = "the S3 endpoint"
    COMMAND_TIMEOUT_S = 30.0
    CLOSE_TIMEOUT_S = 15.0

    def __init__(self, bucket: str = "keyedstate-checkpoints") -> None:
        s3a_jars()  # fail before starting anything
        self.bucket = bucket
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None
        atexit.register(self.close)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def uri(self, path: str) -> str:
        """``s3a://<bucket>/<path>``."""
        return f"s3a://{self.bucket}/{path.lstrip('/')}"

    def hadoop_settings(self) -> dict[str, str]:
        """Hadoop settings for s3a against this endpoint (set them on a session with
        ``remote_storage.apply_hadoop_settings``, or as ``spark.hadoop.*`` at its start)."""
        return {
            "fs.s3a.endpoint": self.endpoint_url,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.access.key": ACCESS_KEY,
            "fs.s3a.secret.key": SECRET_KEY,
            "fs.s3a.aws.credentials.provider": CREDENTIALS_PROVIDER,
            # Fail fast on a dead endpoint (outage tests) instead of s3a's minutes of retries.
            "fs.s3a.attempts.maximum": "3",
            "fs.s3a.retry.limit": "3",
            "fs.s3a.retry.interval": "200ms",
            "fs.s3a.connection.establish.timeout": "5s",
            "fs.s3a.connection.timeout": "30s",
            # moto's server answers "Expect: 100-continue" in a way the AWS SDK takes for a final
            # status 100 (an S3Exception on uploads): send bodies without asking first.
            "fs.s3a.connection.expect.continue": "false",
            # That setting reaches only s3a's synchronous client. copyFromLocalFile (Spark's
            # RocksDB provider uploads its SST and zip files with it) goes through the AWS SDK's
            # transfer manager on the asynchronous client, which fails the same way with it
            # ("S3Exception: Status Code: 100"): use Hadoop's generic copy instead (create() and
            # write, s3a's block output stream on the synchronous client).
            "fs.s3a.optimized.copy.from.local.enabled": "false",
        }

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server process and create the bucket."""
        self._launch([sys.executable, str(SERVER), str(self.port)], stderr=subprocess.DEVNULL)
        self._expect("READY", START_TIMEOUT_S)
        self.client().create_bucket(Bucket=self.bucket)

    def stop(self) -> None:
        """Take the endpoint down: new connections are refused, open ones reset."""
        self._command("down")

    def restart(self) -> None:
        """Bring a stopped endpoint back, same port, same objects."""
        self._command("up")

    def stop_on_request(self, request_regex: str) -> None:
        """Take the endpoint down as a client sends a request whose request line (``PUT
        /<bucket>/<key> HTTP/1.1``) matches ``request_regex``: that request never reaches the
        server, its connection and every other one are reset, new ones refused."""
        self._command(f"down-on {request_regex}")

    def await_stopped(self, timeout_s: float = 60.0) -> str:
        """Wait until ``stop_on_request`` fired; returns the request line that stopped it."""
        answer = self._command(f"await-down {timeout_s}", timeout=timeout_s + 30)
        return answer.split("down at ", 1)[1]

    def close(self) -> None:
        self._end()  # the server exits at the end of its stdin

    # -- inspection ------------------------------------------------------------------------------

    def client(self):  # noqa: ANN201 - boto3's client type is generated
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def list_names(self, uri: str) -> list[str]:
        """Names of the entries directly under ``uri`` (an ``s3a://`` directory)."""
        prefix = uri.split(f"s3a://{self.bucket}/", 1)[1].rstrip("/") + "/"
        names: set[str] = set()
        paginator = self.client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            names.update(o["Key"][len(prefix) :] for o in page.get("Contents", []))
            for common in page.get("CommonPrefixes", []):
                names.add(common["Prefix"][len(prefix) :].rstrip("/"))
        names.discard("")
        return sorted(names)
