"""A tiny scripted HTTP/1.1 server on 127.0.0.1 for forwarding tests: records each request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

HANG = -1  # a scripted "status" that never answers


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float
    status: int = 200  # what it was answered (HANG: never)


async def read_request(reader: asyncio.StreamReader) -> tuple[dict[str, str], bytes] | None:
    """The next request on a connection (its headers, lower-cased, and body); None at its end."""
    while request_line := await reader.readline():
        if not request_line.strip():
            continue
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return headers, await reader.readexactly(int(headers.get("content-length", "0")))
    return None


@dataclass
class ScriptedServer:
    """Answers with `script` in order (then 200); `HANG` leaves the request unanswered."""

    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                headers, body = request
                received = Received(headers, body, time.monotonic())
                self.requests.append(received)
                self.arrived.set()
                status, extra = self.script.pop(0) if self.script else (200, {})
                received.status = status
                if status == HANG:
                    await asyncio.Event().wait()
                reply = b"ok" if status < 300 else b"scripted failure"
                head = f"HTTP/1.1 {status} Scripted\r\nContent-Length: {len(reply)}\r\n"
                head += "".join(f"{k}: {v}\r\n" for k, v in extra.items())
                writer.write(head.encode() + b"\r\n" + reply)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def scripted_server(*script: tuple[int, dict[str, str]]) -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer(list(script))
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
