"""The queryable-state client's HTTP/1.1 transport (python/keyedstate/service/_http.py) against
a real HTTP server on 127.0.0.1 (Python's own): bodies by length, chunked and to the end of the
connection, an interim answer skipped, an answer that is not HTTP closing the connection; a kept
connection the server closed is asked again on a new one, once; a server
that is gone is a clear ``KEYEDSTATE_SERVICE_UNAVAILABLE``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from keyedstate.errors import QueryServiceError
from keyedstate.service import QueryableStateClient
from keyedstate.service._http import Connection

STATES = {"states": []}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes, str | None]] = []  # noqa: RUF012 - the test's record
    # Close every connection after its answer without saying so (as an idle timeout does).
    silent_close = False

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append((self.command, self.path, body, self.headers.get("Authorization")))
        payload = json.dumps(STATES).encode()
        if self.path.endswith("/garbage"):
            self.wfile.write(b"NOT HTTP\r\n\r\n")
            self.wfile.flush()
        elif self.path.endswith("/interim"):
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        elif self.path.endswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (payload[:5], payload[5:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.endswith("/until-close"):
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = True
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = self.silent_close

    do_GET = _answer  # noqa: N815
    do_POST = _answer  # noqa: N815


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    _Handler.seen, _Handler.silent_close = [], False
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_bodies_by_length_chunked_to_the_end_and_a_bad_answer(
    server: ThreadingHTTPServer,
) -> None:
    port = server.server_address[1]
    connection = Connection("127.0.0.1", port, timeout=5)
    headers = b"Authorization: Bearer t0k3n\r\n"
    assert connection.request("POST", "/a", headers, b'{"keys": [1]}') == (200, b'{"states": []}')
    assert connection.request("GET", "/b/chunked", headers, None) == (200, b'{"states": []}')
    assert connection.open, "a kept-alive connection stays open"
    assert connection.request("GET", "/c/until-close", headers, None) == (200, b'{"states": []}')
    assert not connection.open, "a body read to the end of the connection closes it"
    connection = Connection("127.0.0.1", port, timeout=5)
    assert connection.request("GET", "/d/interim", headers, None) == (200, b'{"states": []}')
    with pytest.raises(ConnectionError, match="not an HTTP response"):
        connection.request("GET", "/e/garbage", headers, None)
    assert not connection.open, "a connection whose answer cannot be read is never used again"
    assert [(m, p, b, a) for m, p, b, a in _Handler.seen] == [
        ("POST", "/a", b'{"keys": [1]}', "Bearer t0k3n"),
        ("GET", "/b/chunked", b"", "Bearer t0k3n"),
        ("GET", "/c/until-close", b"", "Bearer t0k3n"),
        ("GET", "/d/interim", b"", "Bearer t0k3n"),
        ("GET", "/e/garbage", b"", "Bearer t0k3n"),
    ]


def test_a_kept_connection_the_server_closed_is_asked_again_once(
    server: ThreadingHTTPServer,
) -> None:
    port = server.server_address[1]
    _Handler.silent_close = True
    client = QueryableStateClient(f"http://127.0.0.1:{port}", "t0k3n")
    assert client.states() == []
    assert client.states() == []  # its kept connection was closed: asked again on a new one
    assert [p for _, p, _, _ in _Handler.seen] == ["/v1/state", "/v1/state"]
    with pytest.raises(ValueError, match="line breaks"):
        QueryableStateClient(f"http://127.0.0.1:{port}", "t0k3n\r\nX-Evil: 1")


def test_a_server_that_is_gone_is_unavailable(server: ThreadingHTTPServer) -> None:
    port = server.server_address[1]
    _Handler.silent_close = True
    client = QueryableStateClient(f"http://127.0.0.1:{port}", "t0k3n", timeout=2)
    assert client.states() == []
    server.shutdown()
    server.server_close()
    with pytest.raises(QueryServiceError) as gone:
        client.states()
    assert gone.value.error_id == "KEYEDSTATE_SERVICE_UNAVAILABLE"
    assert "does not answer" in str(gone.value)
