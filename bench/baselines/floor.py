"""Baseline F: the HTTP floor. httptools under uvloop, as `webhook-inbox serve` runs them, in an
asyncio protocol that answers every request with fixed JSON as soon as its body has arrived: no
framework, no ASGI, no timers, no logging, no database. What a request costs this machine in
the kernel (a read, a write, the loopback), the event loop and the parser, below which no
receiver written on these parts can go."""

from __future__ import annotations

import asyncio
from email.utils import formatdate
from typing import cast

import httptools
import uvloop

BODY = b'{"status":"accepted"}'


def _answer(keep_alive: bool) -> bytes:
    """The whole response, with the headers baseline A's uvicorn sends (date, server,
    content-length, content-type)."""
    head = (
        "HTTP/1.1 200 OK\r\n"
        f"date: {formatdate(usegmt=True)}\r\n"
        "server: uvicorn\r\n"
        f"content-length: {len(BODY)}\r\n"
        "content-type: application/json\r\n"
        + ("" if keep_alive else "connection: close\r\n")
        + "\r\n"
    )
    return head.encode("latin-1") + BODY


# The answers of this second by keep-alive, made again every second (from the server's start)
# as uvicorn makes its date header: not a cost of each request.
ANSWERS: dict[bool, bytes] = {}


def _refresh_answers(loop: asyncio.AbstractEventLoop) -> None:
    ANSWERS.update({keep_alive: _answer(keep_alive) for keep_alive in (True, False)})
    loop.call_later(1.0, _refresh_answers, loop)


class FloorProtocol(asyncio.Protocol):
    """One connection: parse requests, answer each once its message is complete."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's, not a subclass

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    # Parser callbacks: what a receiver must at least keep of a request.
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        keep_alive = self.parser.should_keep_alive()
        self.headers, self.body = [], []
        self.transport.write(ANSWERS[keep_alive])
        if not keep_alive:
            self.transport.close()


async def _serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    _refresh_answers(loop)
    server = await loop.create_server(FloorProtocol, host, port)
    async with server:
        await server.serve_forever()


def run(host: str, port: int) -> None:
    uvloop.run(_serve(host, port))
