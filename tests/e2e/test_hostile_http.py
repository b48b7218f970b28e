"""Hostile requests at the HTTP level, sent raw over a socket to the real server process.

Guards what the ASGI tests cannot reach (issue 6 item 5), each case answered with a clear 4xx,
never a 5xx, and nothing stored:
- header injection (CR, LF, NUL or another control character inside a header; obs-fold;
  conflicting framing): refused by the HTTP parser with 400, so no forged header reaches a
  verifier or the stored headers;
- absurdly long header names or values, or endless headers: refused with 431 by
  `BoundedHttpToolsProtocol` after at most ~64 KiB, where httptools alone would buffer them
  whole (without it these are accepted, stored, and memory grows with the header); more than
  100 headers, or one over 8 KiB, are 431 from the app;
- oversized message ids in a header: 400 naming the limit;
and that the head bound counts heads only: pipelined requests with large bodies all pass.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import asyncpg
import httpx
import psutil
import pytest

from tests.e2e.conftest import emptied_module_database
from tests.server import ServerProcess, http_only

pytestmark = pytest.mark.slow

HEAD = b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\n"
END = b"Connection: close\r\nContent-Length: 2\r\n\r\n{}"

INJECTIONS = {
    "CR inside a value": b"X-Id: a\rX-Evil: 1\r\n",
    "bare LF starting a forged header": b"X-Id: a\nX-Evil: 1\r\n",
    "NUL inside a value": b"X-Id: a\x00b\r\n",
    "control character inside a value": b"X-Id: a\x01b\r\n",
    "obsolete line folding": b"X-Id: a\r\n folded: 1\r\n",
    "space before the colon": b"X-Id : a\r\n",
    "two Content-Length values": b"X-Id: a\r\nContent-Length: 5\r\n",
    "NUL in a header name": b"X-I\x00d: a\r\n",
}

TOO_LONG = {
    "200 KB header value": b"X-Id: long-value\r\nX-Pad: " + b"v" * 200_000 + b"\r\n",
    "200 KB header name": b"X-Id: long-name\r\n" + b"N" * 200_000 + b": 1\r\n",
    "20,000 headers": b"X-Id: many\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(20_000)),
    "50 KB id, over the 8 KiB a header may have": b"X-Id: " + b"i" * 50_000 + b"\r\n",
    "101 headers": b"X-Id: 101\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(100)),
}

ENDLESS = 64 * 1024 * 1024

LONG_IDS = {
    "600-character id": b"X-Id: " + b"i" * 600 + b"\r\n",
    "8,000-character id": b"X-Id: " + b"i" * 8_000 + b"\r\n",
}


@pytest.fixture(scope="module")
def server(
    module_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server for the module's tests: every request they send ends with its connection."""
    sources = '[sources.s]\nkind = "generic"\nid_header = "x-id"\n'
    with http_only(tmp_path_factory.mktemp("hostile"), module_database, sources) as running:
        yield running


database_url = pytest.fixture(emptied_module_database, name="database_url")


async def exchange(port: int, request: bytes) -> tuple[int, bytes, bytes]:
    """Send `request` raw; return the answer's status, head and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # every refusal closes
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


async def stream_endless_header(port: int) -> tuple[bytes, int]:
    """Send one header value 16 KiB at a time until the server answers; return it and the size."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD + b"X-Id: endless\r\nX-Endless: ")
    answer = asyncio.ensure_future(reader.read(300))
    sent = 0
    try:
        while sent < ENDLESS and not answer.done():
            writer.write(b"e" * 16_384)
            await writer.drain()
            sent += 16_384
            await asyncio.sleep(0)  # drain() need not yield: let the answer be read
    except (ConnectionError, OSError):
        pass
    head = await asyncio.wait_for(answer, 10)
    writer.close()
    return head, sent


async def test_hostile_heads_get_a_clear_4xx_and_store_nothing(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    answers = {}
    for name, headers in INJECTIONS.items():
        status, _, body = await exchange(server.port, HEAD + headers + END)
        answers[name] = status
        assert status == 400, (name, body)
    for name, headers in TOO_LONG.items():
        status, head, body = await exchange(server.port, HEAD + headers + END)
        answers[name] = status
        assert status == 431, (name, head)
        assert b"application/problem+json" in head
        assert json.loads(body)["status"] == 431
    for name, headers in LONG_IDS.items():
        status, _, body = await exchange(server.port, HEAD + headers + END)
        answers[name] = status
        assert status == 400, (name, body)
        assert "longer than 512" in json.loads(body)["detail"]

    # An endless header is cut off near the limit, not buffered until the client stops: the
    # 431 arrives while the client is still sending (the socket buffers hold a few MB), and the
    # server's memory does not grow with the header.
    assert server.process is not None
    before = psutil.Process(server.process.pid).memory_info().rss
    head, sent = await stream_endless_header(server.port)
    assert head.startswith(b"HTTP/1.1 431"), head
    assert sent < ENDLESS / 4, f"no answer before {sent} bytes of one header were sent"
    assert psutil.Process(server.process.pid).memory_info().rss - before < 20 * 1024 * 1024

    # Nothing was stored, and the server still serves, with heads of a sane size too.
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0
    fine = {"x-id": "fine", "x-pad": "p" * 8_000}
    reply = httpx.post(f"{server.url}/webhooks/s", content=b"{}", headers=fine)
    assert reply.json()["status"] == "accepted"
    assert not [name for name, status in answers.items() if status >= 500]

    # Three requests with 100 KB bodies in one write: only heads count toward the bound.
    big = b"b" * 100_000
    requests = b"".join(
        HEAD + f"X-Id: piped-{i}\r\nContent-Length: {len(big)}\r\n\r\n".encode() + big
        for i in range(3)
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(requests)
    await writer.drain()
    piped = []
    for _ in range(3):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        piped.append((head.split(b" ")[1], json.loads(await reader.readexactly(length))))
    writer.close()
    assert [(status, a["status"]) for status, a in piped] == [(b"200", "accepted")] * 3
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 4


def head_of(size: int, msg_id: str) -> bytes:
    """A request of exactly `size` bytes of head, its headers each under 8 KiB, then `{}`."""
    start = HEAD + f"X-Id: {msg_id}\r\n".encode()
    end = b"Connection: close\r\nContent-Length: 2\r\n\r\n"
    padding = size - len(start) - len(end)
    count = -(-padding // 8_000)
    overhead = len(b"X-Pad-000: \r\n")
    values, extra = divmod(padding - count * overhead, count)
    pads = [
        b"X-Pad-%03d: " % i + b"p" * (values + (extra if i == 0 else 0)) + b"\r\n"
        for i in range(count)
    ]
    head = start + b"".join(pads) + end
    assert len(head) == size
    return head + b"{}"


async def send_in_pieces(port: int, request: bytes, piece: int) -> tuple[int, bytes]:
    """Send `request` `piece` bytes per write, letting each leave before the next; the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.ensure_future(reader.read())
    try:
        for offset in range(0, len(request), piece):
            if answer.done():
                break
            writer.write(request[offset : offset + piece])
            await writer.drain()
            await asyncio.sleep(0.001)
    except (ConnectionError, OSError):
        pass  # refused while still sending
    received = await asyncio.wait_for(answer, 10)
    writer.close()
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


HEAD_SIZES = {"65 KiB": 65 * 1024, "100 KiB": 100 * 1024, "300 KiB": 300 * 1024}


async def test_heads_over_64_kib_are_431_in_one_write_or_many(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    answers: dict[str, tuple[int, bytes]] = {}
    for name, size in HEAD_SIZES.items():
        request = head_of(size, f"big-{name}")
        status, _, body = await exchange(server.port, request)
        answers[f"{name} in one write"] = status, body
        answers[f"{name} in 4 KiB writes"] = await send_in_pieces(server.port, request, 4_096)
    # A single header of 70 KB, as an Authorization might be.
    status, _, body = await exchange(server.port, HEAD + b"Authorization: " + b"a" * 70_000 + END)
    answers["one 70 KB header"] = status, body
    assert {name: status for name, (status, _) in answers.items()} == dict.fromkeys(answers, 431)
    for _, body in answers.values():  # refused by the head bound, before the app
        assert f"exceed {64 * 1024} bytes" in json.loads(body)["detail"]
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0

    # Exactly at the bound, in one write (the body arriving with it) and in pieces: accepted.
    status, _, _ = await exchange(server.port, head_of(64 * 1024, "at-the-bound"))
    assert status == 200
    status, _ = await send_in_pieces(server.port, head_of(64 * 1024, "at-the-bound-2"), 1_000)
    assert status == 200
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 2


async def test_the_head_bound_reads_chunked_pipelined_and_trickled_requests_right(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    # Each head's end is found before the parser sees it: check that the parser still gets
    # every request whole, however the bytes fall.
    chunked = HEAD + b"X-Id: c\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    after_crlf = b"\r\n" + HEAD + b"X-Id: crlf\r\nContent-Length: 2\r\n\r\n{}"
    bodiless = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(chunked + bodiless + after_crlf)
    await writer.drain()
    statuses = []
    for _ in range(3):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        statuses.append(head.split(b" ")[1])
    writer.close()
    assert statuses == [b"200"] * 3
    # One byte per write, its head's blank line split across writes.
    status, _ = await send_in_pieces(server.port, HEAD + b"X-Id: trickled\r\n" + END, 1)
    assert status == 200
    stored = {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}
    assert stored == {"c", "crlf", "trickled"}
