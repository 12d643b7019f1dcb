"""Reading one state partition of a local checkpoint or native savepoint without Spark or a JVM
(docs/state-processor.md, "Reading without Spark"), with the ``rocksdict`` package::

    from keyedstate.offline.local_reader import open_partition

    with open_partition("/data/ckpt", 1000, 0) as part:
        part.column_families()          # ['count', 'default', 'parity', 'recent']
        part.state("count")             # {'k1': 4, 'k2': 7}: a keyed function's state by name
        for key, value in part.items("default"):   # Spark's operators: (key tuple, value Row)
            ...

How a version is rebuilt, as ``checkpoint.restore.RestoreOperation`` does it: the files of its
manifest's base snapshot (``files[].path``, each checked against its size and CRC32C) are copied
under their RocksDB names (``localName``) into a temporary folder, which rocksdict opens
read-only; the changelogs of the later versions (keyedstate's own format,
``checkpoint.commit.Changelog``) are replayed in order into an overlay held in memory. Nothing
is written where the state is stored.

Format details this relies on: the snapshot's ``OPTIONS`` file records the merge operator of
multi-value column families as ``StringAppendOperator``, which RocksDB rebuilds with a ``,``
delimiter; keyedstate's has none, so the copy's ``OPTIONS`` file is rewritten to the empty
delimiter before rocksdict loads it (merge operands not yet compacted in the snapshot's files are
then joined as keyedstate joins them). Stored keys are Spark's key encodings (``unsafe_row``);
stored values carry an 8-byte last-access stamp (``ttl.TtlValueCodec``), dropped here.
"""

from __future__ import annotations

import functools
import heapq
import json
import os
import re
import shutil
import struct
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from keyedstate._error_catalog import CHECKPOINT_FILE_CORRUPT as FILE_CORRUPT
from keyedstate._error_catalog import CHECKPOINT_FILE_MISSING as FILE_MISSING
from keyedstate._error_catalog import QUERY_CHECKPOINT_INVALID
from keyedstate._error_catalog import STATE_LOAD_FAILED as LOAD_FAILED
from keyedstate.errors import CheckpointError, QueryCheckpointError
from keyedstate.offline import unsafe_row
from keyedstate.offline.local_changelog import (
    CREATE_CF,
    DELETE,
    DELETE_RANGE,
    DROP_CF,
    INSTALL_HINT,
    MERGE,
    PUT,
    read_changelog,
    require,
)
from keyedstate.state.descriptors import BROADCAST, OPERATOR_STATE_KINDS

__all__ = [
    "INSTALL_HINT",
    "LocalPartition",
    "open_partition",
    "read_changelog",
    "rocksdict_rocksdb_version",
]


MANIFEST_FORMAT = 3  # checkpoint.VersionManifest.FormatVersion
SAVEPOINT_METADATA = "_savepoint.json"
DEFAULT_STORE = "default"
DEFAULT_COLUMN_FAMILY = "default"
OPERATOR_STATE_PREFIX = "$op_"  # rocks.KeyGroups.PartitionLocalPrefix
BROADCAST_STATE_PREFIX = "$bc_"  # rocks.KeyGroups.BroadcastPrefix
TIMER_FAMILIES = ("$eventTimers", "$procTimers")  # engine.StateLayout
_MANIFEST_NAME = re.compile(r"^(\d+)(?:_(.+))?\.manifest$")
_CHUNK = 1 << 20


# ---- checksums ----


def _crc32c_extend() -> Callable[[int, bytes], int]:
    return require("google_crc32c", "google-crc32c").extend  # type: ignore[no-any-return]


def _checked_bytes(source: Path, entry: dict[str, Any], version: int, target: Path | None) -> bytes:
    """The bytes of a file ``version`` needs (written to ``target`` when given, else returned),
    checked against the manifest's size and CRC32C: a missing or damaged file is a
    ``CheckpointError`` naming it and the version."""
    extend = _crc32c_extend()
    crc, size, kept = 0, 0, bytearray()
    try:
        with source.open("rb") as src:
            out = target.open("wb") if target is not None else None
            try:
                while chunk := src.read(_CHUNK):
                    crc = extend(crc, chunk)
                    size += len(chunk)
                    if out is not None:
                        out.write(chunk)
                    else:
                        kept += chunk
            finally:
                if out is not None:
                    out.close()
    except FileNotFoundError:
        raise CheckpointError(
            f"[{FILE_MISSING}] State file {source} needed by version {version} is missing",
            FILE_MISSING,
        ) from None
    except IsADirectoryError:
        raise CheckpointError(
            f"[{FILE_CORRUPT}] State file {source} needed by version {version} is a directory",
            FILE_CORRUPT,
        ) from None
    if size != entry["size"] or crc != entry["crc32c"]:
        raise CheckpointError(
            f"[{FILE_CORRUPT}] State file {source} needed by version {version} is damaged: "
            f"{size} bytes, CRC32C {crc:08x}; the manifest says {entry['size']} bytes, "
            f"{entry['crc32c']:08x}",
            FILE_CORRUPT,
        )
    return bytes(kept)


# ---- the state: a read-only snapshot and the replayed changes over it ----


class _Family:
    """One column family: its column family in the snapshot (if any) and, over it, what the
    changelogs wrote since (``None``: deleted), the key ranges they deleted from the snapshot,
    and whether they emptied it."""

    __slots__ = ("base", "emptied", "ranges", "writes")

    def __init__(self, base: Any) -> None:  # noqa: ANN401 - a rocksdict column family
        self.base = base
        self.emptied = base is None
        self.ranges: list[tuple[bytes, bytes]] = []
        self.writes: dict[bytes, bytes | None] = {}

    def _in_base(self, key: bytes) -> bool:
        return not self.emptied and not any(b <= key < e for b, e in self.ranges)

    def get(self, key: bytes) -> bytes | None:
        if key in self.writes:
            return self.writes[key]
        return self.base.get(key) if self._in_base(key) else None

    def apply(self, op: int, key: bytes | None, value: bytes | None) -> None:
        assert key is not None
        if op == PUT:
            self.writes[key] = value
        elif op == DELETE:
            self.writes[key] = None
        elif op == MERGE:
            # keyedstate's merge operator: string append with an empty delimiter.
            assert value is not None
            self.writes[key] = (self.get(key) or b"") + value
        elif op == DELETE_RANGE:
            assert value is not None
            self.ranges.append((key, value))
            for written in [k for k in self.writes if key <= k < value]:
                del self.writes[written]

    def empty(self) -> None:
        self.emptied, self.ranges, self.writes = True, [], {}

    def _base_entries(self) -> Iterator[tuple[bytes, bytes]]:
        if self.emptied:
            return
        it = self.base.iter()
        it.seek_to_first()
        while it.valid():
            key = it.key()
            if key not in self.writes and self._in_base(key):
                yield key, it.value()
            it.next()
        it.status()  # an error while iterating (a damaged block) is raised, not an early end

    def entries(self) -> Iterator[tuple[bytes, bytes]]:
        written = sorted((k, v) for k, v in self.writes.items() if v is not None)
        return heapq.merge(self._base_entries(), written, key=lambda entry: entry[0])


def _close(db: Any, work: Path) -> None:  # noqa: ANN401 - a rocksdict database
    try:
        if db is not None:
            db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


class LocalPartition:
    """One state partition of one version, read without Spark: read-only, its column families
    decoded to Python values (``unsafe_row``: structs as pyspark ``Row``, timestamps as UTC
    ``datetime``, binary and pickled types as ``bytes``).

    TTL is not applied: every stored entry is returned with its last-access stamp dropped,
    **expired entries included** (``keyedstate.state.read`` hides them; here the stamps
    are not compared with any clock).

    Close it (or use it as a context manager): it holds a rocksdict database and a temporary
    copy of the snapshot's files."""

    def __init__(
        self,
        *,
        location: Path,
        directory: Path,
        operator: int,
        partition: int,
        store: str,
        manifest: dict[str, Any],
        families: dict[str, _Family],
        db: Any,  # noqa: ANN401 - a rocksdict database, or None without a snapshot
        work: Path,
        rocksdb_version: str | None,
    ) -> None:
        self.location = location
        self.directory = directory
        self.operator = operator
        self.partition = partition
        self.store = store
        self.manifest = manifest
        self.version: int = manifest["version"]
        self.snapshot_version: int = manifest["snapshotVersion"]
        self.changelog_versions: list[int] = [c["version"] for c in manifest["changelogs"]]
        # The RocksDB version that wrote the snapshot (its OPTIONS file), None without one.
        self.rocksdb_version = rocksdb_version
        self._families = families
        self._schemas = {cf["name"]: cf for cf in manifest["columnFamilies"]}
        self._codecs: dict[str, tuple[Any, ...]] = {}
        self._closed = False
        self._finalizer = weakref.finalize(self, _close, db, work)

    # ---- what it holds ----

    @property
    def declaration(self) -> dict[str, Any] | None:
        """The keyed function's declaration kept in the manifest (uid, function, key schema,
        states with kind and type), or None for Spark's operators."""
        return self.manifest.get("declaration")

    def column_families(self) -> list[str]:
        """The column families of this version, sorted (a keyed function's states, its timers
        ``$eventTimers`` and ``$procTimers``, operator states ``$op_<name>``, and ``default``)."""
        self._check_open()
        return sorted(self._families)

    def __iter__(self) -> Iterator[str]:
        return iter(self.column_families())

    def __contains__(self, column_family: object) -> bool:
        return column_family in self._families

    def __getitem__(self, column_family: str) -> dict[tuple[Any, ...], Any]:
        """``dict(items(column_family))``."""
        return dict(self.items(column_family))

    def _family(self, column_family: str) -> _Family:
        self._check_open()
        family = self._families.get(column_family)
        if family is None:
            raise QueryCheckpointError(
                f"{self._describe()} has no column family {column_family!r}; it has "
                f"{', '.join(repr(n) for n in sorted(self._families))}",
                QUERY_CHECKPOINT_INVALID,
            )
        return family

    def raw_items(self, column_family: str) -> Iterator[tuple[bytes, bytes]]:
        """The stored (key, value) bytes, in RocksDB's key order, as keyedstate stores them."""
        return self._family(column_family).entries()

    def items(self, column_family: str) -> Iterator[tuple[tuple[Any, ...], Any]]:
        """Decoded entries in stored key order: (the key columns as a tuple, the value as a
        ``Row`` of the value schema), or a list of ``Row`` in a multi-value column family
        (list state), in the list's order. Last-access stamps are dropped and expired entries
        are not hidden (TTL is not applied)."""
        family = self._family(column_family)
        decode_key, decode_value = self._codec(column_family)
        return ((decode_key(key), decode_value(value)) for key, value in family.entries())

    def _codec(self, column_family: str) -> tuple[Any, ...]:
        if column_family not in self._codecs:
            cf = self._schemas.get(column_family)
            if cf is None:
                raise QueryCheckpointError(
                    f"{self._describe()}: the manifest records no schema for column family "
                    f"{column_family!r}; read its bytes with raw_items()",
                    QUERY_CHECKPOINT_INVALID,
                )
            try:
                key_of, _ = unsafe_row.key_decoder(
                    unsafe_row.schema_of(cf["keySchemaJson"]),
                    json.loads(cf["keySpecJson"] or "{}"),
                )
                row = unsafe_row.row_decoder(unsafe_row.schema_of(cf["valueSchemaJson"]))
            except unsafe_row.UnsupportedTypeError as error:
                raise unsafe_row.UnsupportedTypeError(
                    f"column family {column_family!r} of {self._describe()}: {error}"
                ) from error
            self._codecs[column_family] = (
                self._checked(column_family, "key", key_of),
                self._checked(column_family, "value", _values(row, cf["multipleValues"])),
            )
        return self._codecs[column_family]

    def _checked(
        self, column_family: str, what: str, decode: Callable[[bytes], Any]
    ) -> Callable[[bytes], Any]:
        def checked(raw: bytes) -> Any:  # noqa: ANN401 - a decoded value
            try:
                return decode(raw)
            except (ValueError, IndexError, struct.error, UnicodeDecodeError) as error:
                raise CheckpointError(
                    f"[{FILE_CORRUPT}] A stored {what} of {len(raw)} bytes in column family "
                    f"{column_family!r} of {self._describe()} does not decode with its recorded "
                    f"schema: {error}",
                    FILE_CORRUPT,
                ) from error

        return checked

    def state(self, name: str) -> Any:  # noqa: ANN401 - a dict, or a list
        """A keyed function's state by its declared name, every key at once: value (reducing,
        aggregating) state ``{key: value}``, list state ``{key: [values]}``, map state
        ``{key: {map key: value}}``; operator list state the partition's list; ``$eventTimers``
        and ``$procTimers`` a list of ``(timestamp, key)`` in time order. A key is the key
        column's value, or a tuple for several key columns (as ``ctx.get_current_key()``).
        Expired entries are not hidden (TTL is not applied)."""
        declaration = self.declaration
        if not declaration or declaration.get("kind") != "keyedFunction":
            raise QueryCheckpointError(
                f"{self._describe()} is not a keyed function's state (its manifest declares no "
                f"keyed function): read its column families with items()",
                QUERY_CHECKPOINT_INVALID,
            )

        def key_of(key: tuple[Any, ...]) -> Any:  # noqa: ANN401 - a key column's value
            return key[0] if len(key) == 1 else key

        if name in TIMER_FAMILIES:
            if name not in self._families:
                return []
            return [(key[0], key_of(key[1:])) for key, _ in self.items(name)]
        declared = {s["name"]: s for s in declaration.get("states", [])}
        if name not in declared:
            raise QueryCheckpointError(
                f"keyed function {declaration.get('function')} (uid {declaration.get('uid')!r}) "
                f"declares no state {name!r}; its states: "
                f"{', '.join(repr(n) for n in declared) or 'none'} "
                f"(and {', '.join(TIMER_FAMILIES)})",
                QUERY_CHECKPOINT_INVALID,
            )
        kind = declared[name]["kind"]
        operator_state = kind in OPERATOR_STATE_KINDS
        column_family = (
            OPERATOR_STATE_PREFIX + name
            if operator_state
            else BROADCAST_STATE_PREFIX + name
            if kind == BROADCAST
            else name
        )
        if column_family not in self._families:
            return [] if operator_state else {}
        entries = self.items(column_family)
        if kind == BROADCAST:
            return {key[0]: row[0] for key, row in entries}
        if operator_state:
            # One list per partition that wrote it (several before a restored query's first
            # batch joins them), joined in partition order.
            return [v for _, row in sorted(entries, key=lambda e: e[0]) for v in row[0] or []]
        if kind == "list":
            return {key_of(key): [row[0] for row in rows] for key, rows in entries}
        if kind == "map":
            width = len(declaration["keySchema"]["fields"])
            maps: dict[Any, dict[Any, Any]] = {}
            for key, row in entries:
                maps.setdefault(key_of(key[:width]), {})[key[width]] = row[0]
            return maps
        return {key_of(key): row[0] for key, row in entries}

    # ---- life cycle ----

    def _describe(self) -> str:
        where = f"state/{self.operator}/{self.partition}"
        if self.store != DEFAULT_STORE:
            where += f"/{self.store}"
        return f"version {self.version} of {where} under {self.location}"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self._describe()} is closed")

    def close(self) -> None:
        """Closes the database and deletes the temporary copy."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> LocalPartition:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalPartition({self._describe()})"


def _values(row: Callable[[bytes, int, int], Any], multiple: bool) -> Callable[[bytes], Any]:
    """A stored value's decoder: ``[int64 stamp][row]``, or in a multi-value column family
    ``[int32 length][int64 stamp][row]`` elements (``ttl.TtlValueCodec``)."""
    if not multiple:

        def single(raw: bytes) -> Any:  # noqa: ANN401
            if len(raw) < 8:
                raise ValueError("shorter than its 8-byte stamp")
            return row(raw, 8, len(raw) - 8)

        return single

    def elements(raw: bytes) -> list[Any]:
        out, pos = [], 0
        while pos < len(raw):
            if len(raw) - pos < 12:
                raise ValueError(f"an element header at byte {pos} is cut short")
            length = int.from_bytes(raw[pos : pos + 4], "big", signed=True)
            pos += 12
            if length < 0 or length > len(raw) - pos:
                raise ValueError(f"an element at byte {pos - 12} claims {length} bytes")
            out.append(row(raw, pos, length))
            pos += length
        return out

    return elements


# ---- finding the version ----


def _local(path: str | os.PathLike[str]) -> Path:
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif text.startswith("file:"):
        text = text[len("file:") :]
    return Path(text)


def _json_file(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"[{FILE_CORRUPT}] {what} {path} cannot be read: {error}", FILE_CORRUPT
        ) from error


def _numbered(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _resolve_operator(root: Path, operator: int | str, partition: int) -> int:
    """An operator id, or the id of the keyed function whose declaration has uid ``operator``."""
    if isinstance(operator, int) and not isinstance(operator, bool):
        return operator
    if not isinstance(operator, str):
        raise TypeError(f"operator must be an operator id (int) or a uid (str), got {operator!r}")
    if operator.isdigit():
        return int(operator)
    found = []
    for op in _numbered(root / "state"):
        manifests = _manifests(root / "state" / str(op) / str(partition))
        if manifests:
            newest = manifests[max(manifests)][-1][1]
            declared = _json_file(newest, "State manifest").get("declaration") or {}
            if declared.get("uid") == operator:
                found.append(op)
    if len(found) != 1:
        raise QueryCheckpointError(
            f"{'no' if not found else 'more than one'} keyed function with uid {operator!r} "
            f"under {root} (operators: {', '.join(map(str, _numbered(root / 'state'))) or 'none'})",
            QUERY_CHECKPOINT_INVALID,
        )
    return found[0]


def _manifests(directory: Path) -> dict[int, list[tuple[str | None, Path]]]:
    """The manifests in a store directory by version: (checkpoint id or None, path)."""
    found: dict[int, list[tuple[str | None, Path]]] = {}
    if directory.is_dir():
        for entry in sorted(directory.iterdir()):
            match = _MANIFEST_NAME.match(entry.name)
            if match and entry.is_file():
                found.setdefault(int(match.group(1)), []).append((match.group(2), entry))
    return found


def _commit_ids(root: Path, batch: int, operator: int) -> set[str]:
    """The state checkpoint ids (checkpoint format v2) the commit log entry of ``batch``
    records for ``operator``."""
    entry = root / "commits" / str(batch)
    if not entry.is_file():
        return set()
    lines = entry.read_text().splitlines()
    if len(lines) < 2:
        return set()
    recorded = (json.loads(lines[1]).get("stateUniqueIds") or {}).get(str(operator)) or []
    return {i for stores in recorded for i in (stores or []) if isinstance(i, str)}


def _choose_manifest(
    root: Path,
    directory: Path,
    operator: int,
    version: int | None,
    savepoint: dict[str, Any] | None,
) -> tuple[int, Path]:
    manifests = _manifests(directory)
    if not manifests:
        raise QueryCheckpointError(
            f"{directory} holds no keyedstate state manifest (a query on another state store "
            f"provider, or not a state directory)",
            QUERY_CHECKPOINT_INVALID,
        )
    if version is None:
        if savepoint is not None:
            version = int(savepoint["stateVersion"])
        else:
            # The last committed batch's state (version = batch + 1), as keyedstate.state.read
            # reads it; the newest manifest without a commit log.
            commits = _numbered(root / "commits")
            if commits and commits[-1] + 1 in manifests:
                version = commits[-1] + 1
            else:
                version = max(manifests)
    candidates = manifests.get(version, [])
    if not candidates:
        kept = ", ".join(map(str, sorted(manifests)))
        raise CheckpointError(
            f"[{FILE_MISSING}] State version {version} is missing: {directory} has no manifest "
            f"of it (versions kept: {kept})",
            FILE_MISSING,
        )
    if len(candidates) == 1:
        return version, candidates[0][1]
    ids = _commit_ids(root, version - 1, operator)
    chosen = [path for checkpoint_id, path in candidates if checkpoint_id in ids]
    if len(chosen) != 1:
        names = ", ".join(p.name for _, p in candidates)
        raise CheckpointError(
            f"[{LOAD_FAILED}] State version {version} of {directory} has several manifests "
            f"({names}) and the commit log entry of batch {version - 1} names "
            f"{'none' if not chosen else 'more than one'} of them",
            LOAD_FAILED,
        )
    return version, chosen[0]


def _read_manifest(
    root: Path, path: Path, version: int, savepoint: dict[str, Any] | None
) -> dict[str, Any]:
    listed = {f["path"]: f for f in (savepoint or {}).get("files", [])}
    relative = path.relative_to(root).as_posix()
    if relative in listed:  # a savepoint lists its manifests with their CRC32C too
        raw = _checked_bytes(path, listed[relative], version, None)
    else:
        raw = path.read_bytes()
    try:
        manifest: dict[str, Any] = json.loads(raw)
    except ValueError as error:
        raise CheckpointError(
            f"[{FILE_CORRUPT}] State version {version} has a corrupt manifest {path} "
            f"({len(raw)} bytes): {error}",
            FILE_CORRUPT,
        ) from error
    if manifest.get("formatVersion") != MANIFEST_FORMAT:
        raise CheckpointError(
            f"[{FILE_CORRUPT}] State manifest {path} has format version "
            f"{manifest.get('formatVersion')}, this reader reads {MANIFEST_FORMAT}",
            FILE_CORRUPT,
        )
    if manifest.get("version") != version:
        raise CheckpointError(
            f"[{FILE_CORRUPT}] State manifest {path} describes version {manifest.get('version')}, "
            f"expected version {version}",
            FILE_CORRUPT,
        )
    return manifest


# ---- rocksdict ----

_ROCKSDB_VERSION = re.compile(r"^\s*rocksdb_version=(\S+)\s*$", re.MULTILINE)
# keyedstate's merge operator is RocksDB's string append with an empty delimiter; OPTIONS files
# record only its name, which RocksDB rebuilds with its default delimiter ",".
_STRING_APPEND = re.compile(
    r"^(\s*merge_operator=)(?:StringAppendOperator|\{id=StringAppendOperator[^}\n]*\})\s*$",
    re.MULTILINE,
)
_EMPTY_DELIMITER = r"\1{id=StringAppendOperator;delimiter=}"


@functools.cache
def rocksdict_rocksdb_version() -> str:
    """The RocksDB version rocksdict bundles, as the OPTIONS file of a new database says."""
    rocksdict = require("rocksdict", "rocksdict")
    with tempfile.TemporaryDirectory(prefix="keyedstate-rocksdict-") as scratch:
        db = rocksdict.Rdict(scratch, rocksdict.Options(raw_mode=True))
        db.close()
        for options in sorted(Path(scratch).glob("OPTIONS-*")):
            match = _ROCKSDB_VERSION.search(options.read_text())
            if match:
                return match.group(1)
    raise RuntimeError("rocksdict wrote no OPTIONS file with its RocksDB version")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _open_snapshot(
    rocksdict: ModuleType, db_dir: Path, version: int, directory: Path, snapshot: int
) -> tuple[Any, str | None]:
    written_by = None
    for options in sorted(db_dir.glob("OPTIONS-*")):
        text = options.read_text()
        match = _ROCKSDB_VERSION.search(text)
        written_by = match.group(1) if match else written_by
        options.write_text(_STRING_APPEND.sub(_EMPTY_DELIMITER, text))
    reader = rocksdict_rocksdb_version()
    if written_by is not None and _version_tuple(written_by) != _version_tuple(reader):
        warnings.warn(
            f"the snapshot of version {snapshot} under {directory} was written by RocksDB "
            f"{written_by}, and rocksdict bundles RocksDB {reader}",
            stacklevel=3,
        )
    try:
        options, families = rocksdict.Options.load_latest(str(db_dir))
        db = rocksdict.Rdict(
            str(db_dir),
            options,
            column_families=families,
            access_type=rocksdict.AccessType.read_only(False),
        )
    except Exception as error:
        raise CheckpointError(
            f"[{LOAD_FAILED}] State version {version} of {directory} (snapshot of version "
            f"{snapshot}) could not be opened with rocksdict (RocksDB {reader}; the snapshot was "
            f"written by RocksDB {written_by or 'unknown'}): {error}",
            LOAD_FAILED,
        ) from error
    # rocksdict records how it opened the folder: keys and values must be its raw bytes.
    config = db_dir / "rocksdict-config.json"
    if config.is_file() and json.loads(config.read_text()).get("raw_mode") is False:
        db.close()
        raise CheckpointError(
            f"[{LOAD_FAILED}] rocksdict opened the snapshot of version "
            f"{snapshot} under {directory} outside its raw mode",
            LOAD_FAILED,
        )
    return db, written_by


def open_partition(
    path: str | os.PathLike[str],
    operator: int | str,
    partition: int,
    *,
    store: str = DEFAULT_STORE,
    version: int | None = None,
    work_dir: str | os.PathLike[str] | None = None,
) -> LocalPartition:
    """Opens one state partition of a local checkpoint or native savepoint, without Spark.

    ``path`` is the checkpoint's (or savepoint's) folder on the local file system; ``operator``
    an operator id (Spark's operators 0, 1, ...; keyed functions 1000, 1001, ...) or a keyed
    function's uid; ``store`` the state store (a stream-stream join has four). ``version`` is
    the state version to read (batch id + 1); by default a savepoint's version, or a
    checkpoint's last committed one (its newest manifest without a commit log).

    The version's files are copied, checked against their sizes and CRC32C, into a temporary
    folder (under ``work_dir`` if given), deleted by ``close()``. A missing or damaged file is
    a ``keyedstate.errors.CheckpointError`` naming it and the version. Needs the ``rocksdict``,
    ``zstandard`` and ``google-crc32c`` packages (``pip install 'keyedstate[local]'``).

    TTL is not applied: expired entries are returned, stamps dropped (see ``LocalPartition``)."""
    rocksdict = require("rocksdict", "rocksdict")
    _crc32c_extend()
    root = _local(path)
    if not root.is_dir():
        raise QueryCheckpointError(
            f"no checkpoint or savepoint at {root} (a local folder)", QUERY_CHECKPOINT_INVALID
        )
    savepoint = None
    if (root / SAVEPOINT_METADATA).is_file():
        savepoint = _json_file(root / SAVEPOINT_METADATA, "Savepoint metadata")
        if savepoint.get("format") != "native":
            raise QueryCheckpointError(
                f"{root} is a {savepoint.get('format')} savepoint: its state is Parquet tables "
                f"(read them with any Parquet reader); only native savepoints hold state files",
                QUERY_CHECKPOINT_INVALID,
            )
    operator_id = _resolve_operator(root, operator, partition)
    directory = root / "state" / str(operator_id) / str(partition)
    if store != DEFAULT_STORE:
        directory = directory / store
    if not directory.is_dir():
        operators = _numbered(root / "state")
        partitions = _numbered(root / "state" / str(operator_id))
        raise QueryCheckpointError(
            f"{root} holds no state of operator {operator_id}, partition {partition}, store "
            f"{store!r} (no {directory}); operators: {', '.join(map(str, operators)) or 'none'}"
            + (
                f"; partitions of {operator_id}: {', '.join(map(str, partitions))}"
                if partitions
                else ""
            ),
            QUERY_CHECKPOINT_INVALID,
        )
    version, manifest_path = _choose_manifest(root, directory, operator_id, version, savepoint)
    manifest = _read_manifest(root, manifest_path, version, savepoint)

    work = Path(tempfile.mkdtemp(prefix="keyedstate-local-", dir=work_dir))
    db = None
    try:
        db_dir = work / "db"
        db_dir.mkdir()
        for entry in manifest["files"]:
            _checked_bytes(directory / entry["path"], entry, version, db_dir / entry["localName"])
        logs = [
            (log, _checked_bytes(directory / log["file"]["path"], log["file"], version, None))
            for log in manifest["changelogs"]
        ]
        snapshot = manifest["snapshotVersion"]
        written_by = None
        if manifest["files"]:
            db, written_by = _open_snapshot(rocksdict, db_dir, version, directory, snapshot)
            names = rocksdict.Rdict.list_cf(str(db_dir), rocksdict.Options(raw_mode=True))
            families = {name: _Family(db.get_column_family(name)) for name in names}
        else:  # the empty database of version 0, which a new RocksDB starts as
            families = {DEFAULT_COLUMN_FAMILY: _Family(None)}
        for log, data in logs:
            source = str(directory / log["file"]["path"])
            for op, cf, key, value in read_changelog(data, source, log["version"]):
                if op == CREATE_CF:
                    families.setdefault(cf, _Family(None))
                elif cf not in families:
                    raise CheckpointError(
                        f"[{FILE_CORRUPT}] State changelog {source} of version {log['version']} "
                        f"writes to column family {cf!r}, which does not exist at that point",
                        FILE_CORRUPT,
                    )
                elif op == DROP_CF:
                    # RocksDB's default column family cannot be dropped: keyedstate empties it.
                    if cf == DEFAULT_COLUMN_FAMILY:
                        families[cf].empty()
                    else:
                        del families[cf]
                else:
                    families[cf].apply(op, key, value)
        return LocalPartition(
            location=root,
            directory=directory,
            operator=operator_id,
            partition=partition,
            store=store,
            manifest=manifest,
            families=families,
            db=db,
            work=work,
            rocksdb_version=written_by,
        )
    except BaseException:
        _close(db, work)
        raise
