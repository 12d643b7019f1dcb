"""keyedstate's changelogs (``checkpoint.commit.Changelog``, format 4) read without a JVM, for
the local reader (``local_reader``): the header, the body's codec (none, LZ4 in lz4-java's block
framing, zstd) and the records (column family definitions, put, delete, merge, delete range,
create and drop of a column family)."""

from __future__ import annotations

import importlib
import struct
from types import ModuleType

from keyedstate._error_catalog import CHECKPOINT_FILE_CORRUPT as FILE_CORRUPT
from keyedstate.errors import CheckpointError

__all__ = ["INSTALL_HINT", "Record", "read_changelog", "require"]

INSTALL_HINT = "pip install 'keyedstate[local]'"


def require(module: str, package: str) -> ModuleType:
    """An optional package of the local reader, or an error saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"reading keyedstate's state without Spark needs the '{package}' package, which is "
            f"not installed: {INSTALL_HINT}"
        ) from error


_CHANGELOG_MAGIC = 0x4B534C47  # "KSLG"
_CHANGELOG_FORMAT = 4
DEFINE_CF, PUT, DELETE, MERGE, DELETE_RANGE, CREATE_CF, DROP_CF, END = 0, 1, 2, 3, 4, 5, 6, 127
_CODECS = {0: "none", 1: "lz4", 2: "zstd"}

# One record: (op, column family, key or begin, value or end); create/drop have neither.
Record = tuple[int, str, bytes | None, bytes | None]


class _Damaged(Exception):
    pass


def _lz4_length(length: int, src: bytes, i: int) -> tuple[int, int]:
    """A literal or match length of 15 (its nibble full) extended by the bytes at ``i``: each
    adds its value, 255 means another follows. The length and the index after them."""
    while True:
        more = src[i]
        i += 1
        length += more
        if more != 255:
            return length, i


def _lz4_block(src: bytes, size: int) -> bytes:
    """One LZ4 block (the raw block format, no frame) of ``size`` bytes decompressed."""
    out = bytearray()
    i, end = 0, len(src)
    while i < end:
        token = src[i]
        i += 1
        literals = token >> 4
        if literals == 15:
            literals, i = _lz4_length(literals, src, i)
        out += src[i : i + literals]
        i += literals
        if i >= end:
            break  # the last sequence has literals only
        offset = src[i] | src[i + 1] << 8
        i += 2
        length = token & 15
        if length == 15:
            length, i = _lz4_length(length, src, i)
        length += 4
        start = len(out) - offset
        if offset == 0 or start < 0:
            raise _Damaged(f"LZ4 match offset {offset} out of range")
        if offset >= length:
            out += out[start : start + length]
        else:  # overlapping: the last `offset` bytes repeat
            pattern = bytes(out[start:])
            out += (pattern * (length // offset + 1))[:length]
    if len(out) != size:
        raise _Damaged(f"an LZ4 block decompresses to {len(out)} bytes, its header says {size}")
    return bytes(out)


def _lz4_java_stream(data: bytes) -> bytes:
    """lz4-java's ``LZ4BlockOutputStream`` framing: blocks of a 21-byte header (``LZ4Block``,
    a token whose high nibble is the method, raw 0x10 or LZ4 0x20, then the compressed and the
    original length and a checksum, little-endian) and the data, ended by an empty block. The
    blocks' XXHash32 checksums are not checked: the file's CRC32C already was."""
    out, i = bytearray(), 0
    header = struct.Struct("<Iii")
    while True:
        if len(data) - i < 21:
            raise _Damaged("it ends before its end marker (truncated)")
        if data[i : i + 8] != b"LZ4Block":
            raise _Damaged("an LZ4 block has no LZ4Block magic")
        method = data[i + 8] & 0xF0
        compressed, original, _ = header.unpack_from(data, i + 9)
        i += 21
        if original == 0:
            return bytes(out)  # the end block (lz4-java stops on it)
        block = data[i : i + compressed]
        if len(block) < compressed or compressed < 0 or original < 0:
            raise _Damaged("it ends before its end marker (truncated)")
        i += compressed
        if method == 0x10:
            out += block
        elif method == 0x20:
            out += _lz4_block(block, original)
        else:
            raise _Damaged(f"unknown LZ4 block method {method:#x}")


def _decompress(codec: int, body: bytes) -> bytes:
    if codec == 0:
        return body
    if codec == 1:
        return _lz4_java_stream(body)
    zstandard = require("zstandard", "zstandard")
    reader = zstandard.ZstdDecompressor().decompressobj()
    try:
        out = reader.decompress(body)
    except zstandard.ZstdError as error:
        raise _Damaged(f"ZstdError: {error}") from error
    if not reader.eof:
        raise _Damaged("it ends before its end marker (truncated)")
    return out  # type: ignore[no-any-return]


def _modified_utf8(raw: bytes) -> str:
    """Java's ``DataOutput.writeUTF`` encoding (NUL as C0 80, surrogate pairs apart)."""
    text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    return text.encode("utf-16", "surrogatepass").decode("utf-16")


def read_changelog(data: bytes, source: str, version: int) -> list[Record]:
    """The records of one changelog file, in order; a damaged or truncated file is a
    ``CheckpointError`` naming ``source`` and ``version`` (never applied in part)."""

    def damaged(why: str) -> CheckpointError:
        return CheckpointError(
            f"[{FILE_CORRUPT}] State changelog {source} of version {version} is damaged: {why}",
            FILE_CORRUPT,
        )

    if len(data) < 6 or int.from_bytes(data[:4], "big") != _CHANGELOG_MAGIC:
        raise damaged("not a keyedstate changelog")
    if data[4] != _CHANGELOG_FORMAT:
        raise damaged(f"format version {data[4]}, this reader reads {_CHANGELOG_FORMAT}")
    codec = data[5]
    if codec not in _CODECS:
        known = ", ".join(f"{k} {v}" for k, v in _CODECS.items())
        raise damaged(f"unknown compression codec id {codec} (known: {known})")
    try:
        body = _decompress(codec, data[6:])
    except _Damaged as error:
        raise damaged(str(error)) from None
    families: dict[int, str] = {}
    records: list[Record] = []
    pos = 0

    def byte() -> int:
        nonlocal pos
        if pos >= len(body):
            raise _Damaged("it ends before its end marker (truncated)")
        pos += 1
        return body[pos - 1]

    def varint() -> int:
        value, shift = 0, 0
        b = byte()
        while b & 0x80:
            if shift > 28:
                raise _Damaged("malformed length")
            value |= (b & 0x7F) << shift
            shift += 7
            b = byte()
        return value | b << shift

    def field() -> bytes:
        nonlocal pos
        n = varint()
        if pos + n > len(body):
            raise _Damaged("it ends before its end marker (truncated)")
        pos += n
        return body[pos - n : pos]

    try:
        op = byte()
        while op != END:
            if op == DEFINE_CF:
                cf_id = varint()
                length = int.from_bytes(bytes([byte(), byte()]), "big")
                if pos + length > len(body):
                    raise _Damaged("it ends before its end marker (truncated)")
                families[cf_id] = _modified_utf8(body[pos : pos + length])
                pos += length
            else:
                cf_id = varint()
                if cf_id not in families:
                    raise _Damaged(f"record refers to undefined column family {cf_id}")
                cf = families[cf_id]
                if op in (PUT, MERGE, DELETE_RANGE):
                    records.append((op, cf, field(), field()))
                elif op == DELETE:
                    records.append((op, cf, field(), None))
                elif op in (CREATE_CF, DROP_CF):
                    records.append((op, cf, None, None))
                else:
                    raise _Damaged(f"unknown record type {op}")
            op = byte()
    except _Damaged as error:
        raise damaged(str(error)) from None
    if pos != len(body):
        raise damaged("data after its end marker")
    return records
