"""A local HTTP sink for bench/outbox: answers every POST 200 at once, keeps connections alive,
and counts what it was sent.

    python -m bench.sink --port 9000

`GET /stats` answers (and starts afresh) a JSON document: the POSTs since the last look, how
many distinct `idempotency-key`s they carried, and the most connections open at once. A
protocol per connection rather than a framework, so that the sink's own cost (it shares the
machine's two cores with the relay and PostgreSQL) stays a small part of a request's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import cast

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class Counts:
    def __init__(self) -> None:
        self.requests = 0
        self.keys: set[bytes] = set()
        self.open = 0
        self.peak = 0

    def snapshot(self) -> bytes:
        """The counts as JSON, then cleared (the peak starts again from what is open now)."""
        document = {
            "requests": self.requests,
            "keys": len(self.keys),
            "peak_connections": self.peak,
        }
        self.requests, self.keys, self.peak = 0, set(), self.open
        return json.dumps(document).encode()


class Connection(asyncio.Protocol):
    """HTTP/1.1 requests read by Content-Length, one after another on a kept-alive connection."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.counts.open += 1
        self.counts.peak = max(self.counts.peak, self.counts.open)

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts.open -= 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length = 0
            key = b""
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    length = int(value)
                elif name == b"idempotency-key":
                    key = value.strip()
            if len(self.buffer) < end + 4 + length:
                return  # the body is still coming
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            if head.startswith(b"get /stats"):
                body = self.counts.snapshot()
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                continue
            self.counts.requests += 1
            self.counts.keys.add(key)
            self.transport.write(OK)


async def serve(port: int) -> None:
    counts = Counts()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(counts), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sink", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
