"""The S3 endpoint process the storage tests start (tests/support/servers/s3_endpoint.py): moto's S3
server, reached through a switch that can take the endpoint down and bring it back.

moto keeps its objects in memory, so restarting moto would lose every checkpoint. An outage is
therefore played at the network: ``down`` closes the public port and resets every open
connection (clients see connection refused/reset, as with a stopped server), ``up`` listens on
the same port again, with the data intact. ``down-on REGEX`` takes the endpoint down at a chosen
moment: when a client sends a request whose request line matches (e.g. the PUT of one upload),
before moto sees it; ``await-down SECONDS`` answers once that happened, with the request line.

usage: python s3_server.py PORT     (prints ``READY <port>``, then one ``OK ...`` per command
read from stdin: ``down``, ``up``, ``down-on REGEX``, ``await-down SECONDS``; end of stdin stops
the process)
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading

from moto.server import ThreadedMotoServer
from ports import free_port

CHUNK = 1 << 16
# A request line seen by the switch (the tail of the previous chunk is kept, so a request line
# split across two reads still matches).
REQUEST_LINE = re.compile(rb"([A-Z]+ /[^ \r\n]* HTTP/1\.[01])\r\n")
TAIL = 4096


class Switch:
    """A TCP forwarder from 127.0.0.1:``port`` to moto that can be closed and reopened."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.trigger: re.Pattern[bytes] | None = None  # down-on: the request that cuts
        self.cut = threading.Event()
        self.cut_request = ""
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)  # type: ignore[arg-type]

    async def up(self) -> None:
        if self.server is None:
            self.server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True
            )

    async def down(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in list(self.writers):
            # An abort (RST), like a server process that died.
            writer.transport.abort()
        self.writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer, watch=True), self._pipe(up_reader, writer, watch=False)
        )
        self.writers.difference_update((writer, up_writer))

    def arm(self, pattern: str) -> None:
        self.cut.clear()
        self.cut_request = ""
        self.trigger = re.compile(pattern.encode())

    def _triggered(self, tail: bytes, data: bytes) -> bool:
        """Whether ``data`` (after ``tail``, already forwarded) completes a request line that
        matches the armed pattern (which is then disarmed)."""
        trigger = self.trigger
        if trigger is None:
            return False
        for match in REQUEST_LINE.finditer(tail + data):
            if match.end() > len(tail) and trigger.search(match.group(1)):
                self.trigger = None
                self.cut_request = match.group(1).decode(errors="replace")
                return True
        return False

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watch: bool
    ) -> None:
        tail = b""
        try:
            while data := await reader.read(CHUNK):
                if watch and self._triggered(tail, data):
                    await self.down()  # the request never reaches moto
                    self.cut.set()
                    return
                tail = (tail + data)[-TAIL:]
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    moto.start()
    switch = Switch(int(argv[1]), moto.get_host_and_port()[1])
    switch.run(switch.up())
    print(f"READY {switch.port}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "down":
            switch.run(switch.down())
        elif command == "up":
            switch.run(switch.up())
        elif command.startswith("down-on "):
            switch.arm(command.split(" ", 1)[1])
        elif command.startswith("await-down "):
            if not switch.cut.wait(float(command.split(" ", 1)[1])):
                print(f"ERROR no request matched in {command.split(' ', 1)[1]} s", flush=True)
                continue
            print(f"OK down at {switch.cut_request}", flush=True)
            continue
        elif command:
            print(f"ERROR unknown command {command}", flush=True)
            continue
        print(f"OK {command}", flush=True)
    switch.run(switch.down())
    moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
