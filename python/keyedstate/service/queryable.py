"""Queryable state's client (Flink's ``QueryableStateClient``): lookups of a running query's
state by key, through the query service of its application (docs/queryable-state.md).

    client = QueryableStateClient.for_checkpoint("/data/ckpt")  # or (url, token)
    client.get("count-per-user", "alice")  # 42: the value at the last committed batch
    client.get_many("count-per-user", ["alice", "bob"], min_batch=812)
    client.lookup("count-per-user", ["alice"]).batch  # the batch the answer reflects

Plain HTTP and JSON with the standard library, on one kept-alive connection per thread.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import json
import math
import pickle
import sys
import threading
import urllib.parse
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keyedstate._error_catalog import SERVICE_NOT_FOUND, SERVICE_UNAVAILABLE
from keyedstate.errors import QueryServiceError, error_of
from keyedstate.service._http import Connection, ConnectionLost
from keyedstate.service.client import service_address

__all__ = [
    "PartitionBehind",
    "StaleStateWarning",
    "QueryableStateClient",
    "QueryableStateInfo",
    "StateLookup",
]

Decoder = Callable[[Any], Any]
# No map key given: a map state's lookup answers each key's whole map.
_NO_MAP_KEY: Any = object()


class StaleStateWarning(UserWarning):
    """Some values of a lookup are older than its batch (see ``StateLookup.behind``)."""


@functools.lru_cache(maxsize=256)
def _lookup_path(name: str, query_id: str | None) -> str:
    quoted = urllib.parse.quote(name, safe="")
    if query_id is None:
        return f"/v1/state/{quoted}"
    return f"/v1/queries/{urllib.parse.quote(query_id, safe='')}/state/{quoted}"


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside this module (get -> lookup -> warn)."""
    frame, level = sys._getframe(1), 1  # noqa: SLF001 - warnings' own way to count frames
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


# The longest a lookup may wait for a batch (the service's bound).
MAX_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class QueryableStateInfo:
    """A queryable state of a running query (``GET /v1/state``)."""

    name: str
    query_id: str
    run_id: str
    kind: str
    function: str
    operator: int
    partitions: int
    key_columns: tuple[tuple[str, dict[str, Any] | str], ...]
    value_type: dict[str, Any] | str
    map_key_type: dict[str, Any] | str | None
    pickled_value: bool
    pickled_map_key: bool
    running: bool = True


@dataclass(frozen=True)
class PartitionBehind:
    """A partition whose values an answer gives as of an older batch than the answer's: the
    service read it from the checkpoint, where the files of the newer batch cannot be read
    (``reason`` names them)."""

    partition: int
    batch: int
    reason: str


@dataclass(frozen=True)
class StateLookup:
    """The answer to one lookup: the values of the keys asked, in their order, as of ``batch``,
    the query's last committed batch when the service answered (at least ``min_batch``), except
    the keys of the partitions in ``behind`` (each warned of)."""

    name: str
    query_id: str
    batch: int
    values: list[Any]
    behind: list[PartitionBehind] = field(default_factory=list)


def _decoder(data_type: dict[str, Any] | str, pickled: bool = False) -> Decoder:
    """JSON (docs/queryable-state.md, "Values in JSON") -> the Python value of a Spark type."""
    if pickled:
        return lambda v: None if v is None else pickle.loads(base64.b64decode(v))  # noqa: S301
    if isinstance(data_type, str):
        if data_type in ("float", "double"):
            return lambda v: None if v is None else float(v)  # "NaN", "Infinity" included
        if data_type.startswith("decimal"):
            return lambda v: None if v is None else decimal.Decimal(v)
        if data_type == "date":
            return lambda v: None if v is None else dt.date.fromisoformat(v)
        if data_type == "timestamp":
            # As pyspark's collect(): the local time, without a time zone.
            return lambda v: (
                None
                if v is None
                else dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
                .astimezone()
                .replace(tzinfo=None)
            )
        if data_type == "timestamp_ntz":
            return lambda v: None if v is None else dt.datetime.fromisoformat(v)
        if data_type == "binary":
            return lambda v: None if v is None else base64.b64decode(v)
        return lambda v: v
    kind = data_type["type"]
    if kind == "array":
        element = _decoder(data_type["elementType"])
        return lambda v: None if v is None else [element(x) for x in v]
    if kind == "map":
        key, value = _decoder(data_type["keyType"]), _decoder(data_type["valueType"])
        return lambda v: None if v is None else {key(k): value(x) for k, x in v}
    if kind == "struct":
        from pyspark.sql import Row

        fields = [(f["name"], _decoder(f["type"])) for f in data_type["fields"]]
        return lambda v: None if v is None else Row(**{n: d(v.get(n)) for n, d in fields})
    return lambda v: v


def _encode_key(value: Any, data_type: Any = None) -> Any:  # noqa: ANN401 - a key column's value
    """A key column's Python value as the service parses it (``data_type``: its Spark type's
    JSON, when known)."""
    if isinstance(value, dt.datetime) and value.tzinfo is None and data_type == "timestamp_ntz":
        return value.isoformat()
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return (
            value
            if math.isfinite(value)
            else ("NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity"))
        )
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        # Naive datetimes are local times, as pyspark takes them.
        aware = value if value.tzinfo is not None else value.astimezone()
        return aware.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, tuple | list):
        return [_encode_key(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode_key(v) for k, v in value.items()}
    raise TypeError(
        "a key's value must be a str, number, bool, date, datetime, Decimal or bytes, "
        f"got {value!r}"
    )


class QueryableStateClient:
    """Lookups of queryable state in one application's query service: ``url`` and ``token``
    as its registry entry names them (:func:`keyedstate.service.service_address`), or
    :meth:`for_checkpoint`. ``query_id`` names the query whose states lookups read (by
    default: the one running query of the application that has the state asked). Refusals
    raise ``keyedstate.errors.QueryServiceError`` with the service's ``error_id``.
    Thread-safe: each thread keeps its own connection."""

    def __init__(
        self, url: str, token: str, *, query_id: str | None = None, timeout: float = 10.0
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"the query service's url must be http://host:port, got {url!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.query_id = query_id
        self.timeout = timeout
        self._host, self._port = parsed.hostname, parsed.port or 80
        if any(c in token for c in "\r\n\0"):
            raise ValueError("the query service's token must not hold line breaks")
        self._headers = (
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n".encode("latin-1")
        )
        self._local = threading.local()
        self._states: dict[tuple[str, str], QueryableStateInfo] = {}
        self._decoders: dict[tuple[str, str], Decoder] = {}  # by state name and query run

    @classmethod
    def for_checkpoint(cls, checkpoint: str, *, timeout: float = 10.0) -> QueryableStateClient:
        """The client of the query running on ``checkpoint`` on this machine, or of the one
        that stopped there last in an application still running (its lookups read that
        query's states; a stopped query's from its checkpoint)."""
        address = service_address(checkpoint, stopped=True)
        if address is None:
            raise error_of(
                SERVICE_NOT_FOUND,
                f"No query on {checkpoint} serves its state on this machine (no entry in the "
                "query service's registry: no application running it, or that ran it, is up)",
            )
        return cls(address.url, address.token, query_id=address.query_id, timeout=timeout)

    # -- HTTP --------------------------------------------------------------------------------

    def _connection(self, timeout: float) -> tuple[Connection, bool]:
        """This thread's connection (a new one unless it has one open), and whether it is kept."""
        connection = getattr(self._local, "connection", None)
        kept = connection is not None and connection.open
        if not kept:
            connection = Connection(self._host, self._port, timeout)
            self._local.connection = connection
        connection.set_timeout(timeout)
        return connection, kept

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, wait: float = 0.0
    ) -> Any:  # noqa: ANN401
        """One request; ``wait`` is how long the service may take beyond the client's timeout
        (a lookup that waits for a batch)."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        for attempt in (0, 1):
            kept = False
            try:
                connection, kept = self._connection(self.timeout + wait)
                status, payload = connection.request(method, path, self._headers, data)
                break
            except OSError as unreachable:
                self.close()
                # A kept connection the server closed meanwhile: once more on a new one.
                if attempt == 0 and kept and isinstance(unreachable, ConnectionLost):
                    continue
                raise error_of(
                    SERVICE_UNAVAILABLE,
                    f"The query service at {self.url} does not answer: {unreachable}",
                ) from unreachable
        try:
            answer = json.loads(payload)
        except ValueError:
            raise error_of(
                SERVICE_UNAVAILABLE,
                f"{self.url}{path} answered HTTP {status} with no JSON: is this a keyedstate "
                "query service?",
            ) from None
        if status >= 400:
            error_id, message = answer.get("error_id"), str(answer.get("message"))
            if error_id is None:
                raise QueryServiceError(f"HTTP {status}: {message}")
            raise error_of(str(error_id), message)
        return answer

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    # -- the states ----------------------------------------------------------------------------

    def states(self) -> list[QueryableStateInfo]:
        """The queryable states of the application's running queries (known once a query has
        planned its first batch)."""
        found = []
        for s in self._request("GET", "/v1/state")["states"]:
            info = QueryableStateInfo(
                name=s["name"],
                query_id=s["query"],
                run_id=s["run"],
                kind=s["kind"],
                function=s["function"],
                operator=int(s["operator"]),
                partitions=int(s["partitions"]),
                key_columns=tuple((c["name"], c["type"]) for c in s["key_columns"]),
                value_type=s["value_type"],
                map_key_type=s.get("map_key_type"),
                pickled_value=bool(s["pickled"]["value"]),
                pickled_map_key=bool(s["pickled"]["map_key"]),
                running=bool(s.get("running", True)),
            )
            self._states[(info.name, info.query_id)] = info
            found.append(info)
        return found

    def _info(
        self, name: str, query_id: str | None, refresh: bool = False
    ) -> QueryableStateInfo | None:
        """What the service said of state ``name`` (of ``query_id``, or of the one query that
        has it), asked again when unknown or ``refresh``."""

        def known() -> list[QueryableStateInfo]:
            return [
                i
                for (n, q), i in self._states.items()
                if n == name and (query_id is None or q == query_id)
            ]

        if refresh or not known():
            self._states = {}
            self.states()
        found = known()
        return found[0] if len(found) == 1 else None

    def _decoder_of(self, info: QueryableStateInfo) -> Decoder:
        known = self._decoders.get((info.name, info.run_id))
        if known is not None:
            return known
        value = _decoder(info.value_type, info.pickled_value)
        if info.kind == "list":
            decode: Decoder = lambda v: None if v is None else [value(x) for x in v]  # noqa: E731
        elif info.kind == "map":
            key = _decoder(info.map_key_type or "string", info.pickled_map_key)
            decode = lambda v: None if v is None else {key(k): value(x) for k, x in v["entries"]}  # noqa: E731
        else:
            decode = value
        self._decoders[(info.name, info.run_id)] = decode
        return decode

    def _encode(self, info: QueryableStateInfo | None, key: Any) -> Any:  # noqa: ANN401
        if info is None:
            return _encode_key(key)
        types = [t for _, t in info.key_columns]
        if len(types) == 1:
            return _encode_key(key, types[0])
        if isinstance(key, tuple | list) and len(key) == len(types):
            return [_encode_key(v, t) for v, t in zip(key, types, strict=True)]
        return _encode_key(key)  # the service names what is wrong

    # -- lookups -------------------------------------------------------------------------------

    def lookup(
        self,
        name: str,
        keys: Sequence[Any],
        *,
        query_id: str | None = None,
        min_batch: int | None = None,
        timeout: float | None = None,
        limit: int | None = None,
        map_key: Any = _NO_MAP_KEY,  # noqa: ANN401 - a map state's key
        map_key_from: Any = _NO_MAP_KEY,  # noqa: ANN401
        map_key_to: Any = _NO_MAP_KEY,  # noqa: ANN401
        map_key_prefix: str | None = None,
        start: int | None = None,
        stop: int | None = None,
    ) -> StateLookup:
        """The values of ``keys`` in queryable state ``name`` at the query's last committed
        batch, at least ``min_batch`` (waited for up to ``timeout`` seconds). A key of several
        columns is a tuple. Value, reducing and aggregating state give the stored value (an
        aggregating state's accumulator), list state a list, map state a dict (at most
        ``limit`` entries per key: a key with more raises), or with ``map_key`` the value of that
        one entry of each key's map. A part of each map: the entries whose map keys are from
        ``map_key_from`` (inclusive) to ``map_key_to`` (exclusive), or start with
        ``map_key_prefix`` (string map keys), in map-key order, at most ``limit``; a part of each
        list: its elements ``start`` to ``stop``, as Python slices it. A key without state gives
        None."""
        if isinstance(keys, str | bytes) or not isinstance(keys, Sequence) or not keys:
            raise TypeError(f"keys must be a non-empty sequence of keys, got {keys!r}")
        query_id = query_id or self.query_id
        info = self._info(name, query_id)
        body: dict[str, Any] = {"keys": [self._encode(info, k) for k in keys]}
        if min_batch is not None:
            body["min_batch"] = int(min_batch)
        wait = min(self.timeout, MAX_TIMEOUT_S) if timeout is None else timeout
        if not 0 < wait <= MAX_TIMEOUT_S:
            raise ValueError(
                f"timeout must be more than 0 and at most {MAX_TIMEOUT_S} s, got {wait!r}"
            )
        body["timeout_ms"] = max(1, int(1000 * wait))
        if limit is not None:
            body["limit"] = int(limit)
        entry = map_key is not _NO_MAP_KEY
        if entry:
            if info is not None and info.pickled_map_key:
                raise TypeError(
                    f"map_key reads an entry of a map whose keys are typed; {name!r} has pickled "
                    "keys: read the whole map"
                )
            body["map_key"] = _encode_key(map_key, None if info is None else info.map_key_type)
        key_type = None if info is None else info.map_key_type
        ranged = map_key_from is not _NO_MAP_KEY or map_key_to is not _NO_MAP_KEY
        if (ranged or map_key_prefix is not None) and info is not None and info.pickled_map_key:
            raise TypeError(
                f"a range of map keys is read of a map whose keys are typed; {name!r} has pickled "
                "keys, which have no order: read the whole map"
            )
        if map_key_from is not _NO_MAP_KEY:
            body["map_key_from"] = _encode_key(map_key_from, key_type)
        if map_key_to is not _NO_MAP_KEY:
            body["map_key_to"] = _encode_key(map_key_to, key_type)
        if map_key_prefix is not None:
            body["map_key_prefix"] = str(map_key_prefix)
        if start is not None:
            body["start"] = int(start)
        if stop is not None:
            body["stop"] = int(stop)
        answer = self._request("POST", _lookup_path(name, query_id), body, wait=wait)
        if info is None or (info.query_id, info.run_id) != (answer["query"], answer["run"]):
            info = self._info(name, answer["query"], refresh=True)  # a restart: types may differ
        decode: Decoder = (lambda v: v) if info is None else self._decoder_of(info)
        if entry and info is not None:
            decode = _decoder(info.value_type, info.pickled_value)
        if answer["kind"] == "map" and not entry:
            truncated = [k for k, v in zip(keys, answer["values"], strict=True) if v and v["more"]]
            if truncated:
                raise QueryServiceError(
                    f"map state {name!r} holds more than limit={limit or 10000} entries for keys "
                    f"{truncated[:5]!r}: ask with a larger limit"
                )
        behind = [
            PartitionBehind(int(b["partition"]), int(b["batch"]), str(b["reason"]))
            for b in answer.get("behind", [])
        ]
        for b in behind:
            warnings.warn(
                f"state {name!r}: the keys of partition {b.partition} are as of batch {b.batch}, "
                f"not {answer['batch']}: {b.reason}",
                StaleStateWarning,
                stacklevel=_callers_level(),
            )
        return StateLookup(
            name=name,
            query_id=str(answer["query"]),
            batch=int(answer["batch"]),
            values=[decode(v) for v in answer["values"]],
            behind=behind,
        )

    def get(self, name: str, key: Any, **options: Any) -> Any:  # noqa: ANN401
        """The value of one key (see :meth:`lookup` for the options), or None."""
        return self.lookup(name, [key], **options).values[0]

    def get_many(self, name: str, keys: Sequence[Any], **options: Any) -> list[Any]:  # noqa: ANN401
        """The values of several keys, in their order, all of one batch."""
        return self.lookup(name, keys, **options).values
