"""The query service's client: plain HTTP and JSON with the standard library, no JVM.

The applications on this machine name the service of each running query in a registry of the
user's (``~/.keyedstate/services``, or ``$KEYEDSTATE_SERVICE_REGISTRY``: address, token, query,
run, checkpoint), so a tool given only a query's checkpoint finds it with
:func:`service_address`; any other program gives the address and the token
(``spark.keyedstate.service.token``)::

    client = QueryServiceClient("http://127.0.0.1:41877", token)
    [query] = client.queries()
    info = client.savepoint(query.id, "/savepoints/sp-1")  # taken in the query's application
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyedstate._error_catalog import SERVICE_UNAVAILABLE
from keyedstate.errors import QueryServiceError, error_of, operation_error

REGISTRY_VARIABLE = "KEYEDSTATE_SERVICE_REGISTRY"


@dataclass(frozen=True)
class ServiceAddress:
    """Where a query's service answers, as the registry records it. ``stopped``: the run
    stopped, and its application still serves its state (read from its checkpoint)."""

    url: str
    token: str
    query_id: str
    run_id: str
    checkpoint: str
    application_id: str
    pid: int
    stopped: bool = False


@dataclass(frozen=True)
class RunningQuery:
    """A streaming query the service serves (``GET /v1/queries``)."""

    id: str
    run_id: str
    name: str | None
    checkpoint: str
    last_committed_batch: int | None
    trigger_active: bool


def registry_folder() -> Path:
    """The folder where this machine's applications name their queries' services (the JVM's
    ``ServiceRegistry.folder``)."""
    configured = os.environ.get(REGISTRY_VARIABLE)
    return Path(configured) if configured else Path.home() / ".keyedstate" / "services"


def _same_location(a: str, b: str) -> bool:
    """Whether two checkpoint locations are one: local paths resolved, others as written."""

    def normal(location: str) -> str:
        parsed = urllib.parse.urlparse(location)
        if parsed.scheme in ("", "file"):
            path = urllib.parse.unquote(parsed.path) if parsed.scheme else location
            return os.path.realpath(path)
        return location.rstrip("/")

    return normal(a) == normal(b)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def service_address(checkpoint: str, *, stopped: bool = False) -> ServiceAddress | None:
    """The service of the query running on ``checkpoint`` in an application of this machine, as
    the registry names it; ``None`` without one (no query runs there, or it runs without the
    service, or in an application whose process is gone). With ``stopped``, a query that ran
    there and stopped in an application that still runs is found too (a running one first, then
    the latest stopped). The entry may still be stale (the process id reused): ask the service
    before trusting it."""
    folder = registry_folder()
    if not folder.is_dir():
        return None
    found: list[tuple[float, ServiceAddress]] = []
    for entry in sorted(folder.glob("*.json")):
        try:
            owner = entry.stat()
            if owner.st_uid != os.getuid() or owner.st_mode & 0o077:
                continue  # not written by this user's applications, or readable by others
            raw = json.loads(entry.read_text(encoding="utf-8"))
            address = ServiceAddress(
                url=str(raw["url"]),
                token=str(raw["token"]),
                query_id=str(raw["queryId"]),
                run_id=str(raw["runId"]),
                checkpoint=str(raw["checkpoint"]),
                application_id=str(raw["applicationId"]),
                pid=int(raw["pid"]),
                stopped=bool(raw.get("stopped", False)),
            )
            written = float(raw.get("writtenAtMs", 0))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or not an entry
        if (
            _same_location(address.checkpoint, checkpoint)
            and (stopped or not address.stopped)
            and _alive(address.pid)
        ):
            found.append((written, address))
    running = [a for _, a in found if not a.stopped]
    if running:
        return running[0]
    return max(found, key=lambda f: f[0])[1] if found else None


class QueryServiceClient:
    """Requests to one application's query service. A refusal raises
    ``keyedstate.errors.QueryServiceError`` (its ``error_id`` says which); a service that does
    not answer raises it with ``KEYEDSTATE_SERVICE_UNAVAILABLE``; a savepoint that failed raises
    the error of its failure, as ``keyedstate.savepoint`` does."""

    def __init__(self, url: str, token: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:  # noqa: ANN401
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as refused:
            try:
                answer = json.loads(refused.read())
                error_id, message = answer.get("error_id"), str(answer["message"])
            except (ValueError, KeyError, TypeError, AttributeError):
                raise error_of(
                    SERVICE_UNAVAILABLE,
                    f"{self.url}{path} answered HTTP {refused.code} without the service's error: "
                    "is this a keyedstate query service?",
                ) from refused
            if error_id is None:  # a failure of the service itself (HTTP 500), logged on the driver
                raise QueryServiceError(f"HTTP {refused.code}: {message}") from None
            raise error_of(str(error_id), message) from None
        except (urllib.error.URLError, OSError, ValueError) as unreachable:
            reason = getattr(unreachable, "reason", unreachable)
            raise error_of(
                SERVICE_UNAVAILABLE, f"The query service at {self.url} does not answer: {reason}"
            ) from unreachable

    def queries(self) -> list[RunningQuery]:
        """The application's running streaming queries."""
        answer = self._request("GET", "/v1/queries")
        return [
            RunningQuery(
                id=q["id"],
                run_id=q["run_id"],
                name=q.get("name"),
                checkpoint=q["checkpoint"],
                last_committed_batch=q.get("last_committed_batch"),
                trigger_active=bool(q["trigger_active"]),
            )
            for q in answer["queries"]
        ]

    def trigger_savepoint(self, query_id: str, target: str, *, format: str = "native") -> str:
        """Ask for a savepoint of the running query at ``target`` (Flink's ``POST
        /jobs/:jobid/savepoints``); returns the request id :meth:`savepoint_status` answers."""
        answer = self._request(
            "POST", f"/v1/queries/{query_id}/savepoints", {"target": target, "format": format}
        )
        return str(answer["request_id"])

    def savepoint_status(self, query_id: str, request_id: str) -> dict[str, Any]:
        """The request's status: ``status`` is ``in_progress``, ``completed`` (with
        ``savepoint``, its metadata) or ``failed`` (with ``error``: ``error_id``, ``message``)."""
        return dict(self._request("GET", f"/v1/queries/{query_id}/savepoints/{request_id}"))

    def savepoint(
        self,
        query_id: str,
        target: str,
        *,
        format: str = "native",
        timeout: float | None = None,
        poll_interval: float = 0.1,
    ) -> Any:  # noqa: ANN401 - keyedstate.offline.savepoints.SavepointInfo
        """Take a savepoint of the running query in its application and wait for it (at most
        ``timeout`` seconds, if given): its ``SavepointInfo``."""
        request_id = self.trigger_savepoint(query_id, target, format=format)
        return self.await_savepoint(
            query_id, request_id, target, timeout=timeout, poll_interval=poll_interval
        )

    def await_savepoint(
        self,
        query_id: str,
        request_id: str,
        target: str,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.1,
    ) -> Any:  # noqa: ANN401 - keyedstate.offline.savepoints.SavepointInfo
        """Wait for a savepoint request (at most ``timeout`` seconds, if given): the
        ``SavepointInfo`` of the savepoint at ``target``, or its failure raised."""
        from keyedstate.offline.savepoints import savepoint_info

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.savepoint_status(query_id, request_id)
            if status["status"] == "completed":
                return savepoint_info(target, status["savepoint"])
            if status["status"] == "failed":
                error = status["error"]
                error_id = error.get("error_id")
                raise operation_error(error_id and str(error_id), str(error["message"]))
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"Savepoint request {request_id} of query {query_id} is not done after "
                    f"{timeout} s (it goes on; ask "
                    f"{self.url}/v1/queries/{query_id}/savepoints/{request_id})"
                )
            time.sleep(poll_interval)
