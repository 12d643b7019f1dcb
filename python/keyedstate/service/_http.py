"""One kept-alive HTTP/1.1 connection, lean enough for lookups by the thousand per second.

``http.client`` parses every response's headers with the ``email`` package and sends through
several layers: about half of a lookup's client-side CPU. The query service answers JSON with a
``Content-Length`` (or, from a proxy in between, chunked), so a request is one ``sendall`` and
a response a status line, a few header lines and a body read off a buffered socket.
"""

from __future__ import annotations

import socket

_MAX_LINE = 65536


class ConnectionLost(ConnectionError):
    """The server closed the connection before answering (a kept connection it timed out)."""


class Connection:
    """A connection to ``host:port``; :meth:`request` sends one request and reads its answer."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        authority = f"[{host}]" if ":" in host else host  # an IPv6 address in brackets
        self._host_header = f"Host: {authority}:{port}\r\n".encode("latin-1")
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = self._sock.makefile("rb")
        self.open = True

    def set_timeout(self, timeout: float) -> None:
        self._sock.settimeout(timeout)

    def request(
        self, method: str, path: str, headers: bytes, body: bytes | None
    ) -> tuple[int, bytes]:
        """``headers``: ready header lines, each ending in CRLF. Returns the status and body.
        Anything that interrupts it (a timeout, a malformed answer, KeyboardInterrupt) closes the
        connection: an answer half read must never be taken for the next request's."""
        head = f"{method} {path} HTTP/1.1\r\n".encode("latin-1") + self._host_header + headers
        if body is not None:
            head += b"Content-Length: %d\r\n" % len(body)
        try:
            self._sock.sendall(head + b"\r\n" + (body or b""))
            status, payload, close = self._read_response(method)
        except (BrokenPipeError, ConnectionResetError) as lost:
            self.close()
            raise ConnectionLost(str(lost)) from lost
        except ValueError as malformed:
            self.close()
            raise ConnectionError(f"a malformed HTTP answer: {malformed}") from malformed
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, payload

    def _read_response(self, method: str) -> tuple[int, bytes, bool]:
        while True:  # interim answers (1xx) are skipped
            status_line = self._reader.readline(_MAX_LINE)
            if not status_line:
                raise ConnectionLost("the server closed the connection")
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
                raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
            status = int(parts[1])
            length, chunked, close = None, False, parts[0] == b"HTTP/1.0"
            while True:
                line = self._reader.readline(_MAX_LINE)
                if not line:
                    raise ConnectionLost("the server closed the connection in the headers")
                if line in (b"\r\n", b"\n"):
                    break
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
            if not 100 <= status < 200:
                break
        if method == "HEAD" or status in (204, 304):
            return status, b"", close
        if chunked:
            return status, self._read_chunked(), close
        if length is not None:
            payload = self._reader.read(length)
            if len(payload) != length:
                raise ConnectionLost(f"the answer ended after {len(payload)} of {length} bytes")
            return status, payload, close
        return status, self._reader.read(), True

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self._reader.readline(_MAX_LINE).split(b";", 1)[0], 16)
            if size == 0:
                while self._reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(self._reader.read(size))
            self._reader.readline(_MAX_LINE)

    def close(self) -> None:
        if self.open:
            self.open = False
            self._reader.close()
            self._sock.close()
