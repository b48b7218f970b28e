"""Deliveries the HTTP protocol serves without ASGI (`service.api.http_protocol`), over raw
sockets to the real server process: they answer exactly as the ASGI route does, keep-alive
and pipelining keep their order, and a request the shortcut does not take (a chunked body, a
percent-encoded source, an unknown one, a nested path) still gets the ASGI route's answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import asyncpg
import pytest

from tests.conftest import AppFactory
from tests.e2e.conftest import emptied_module_database
from tests.pg import empty_tables
from tests.server import ServerProcess, http_only

pytestmark = pytest.mark.slow

SOURCES = '[sources.s]\nkind = "generic"\nid_header = "x-id"\ntoken = "t0ken"\n'


@pytest.fixture(scope="module")
def server(
    module_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with http_only(tmp_path_factory.mktemp("direct"), module_database, SOURCES) as running:
        yield running


database_url = pytest.fixture(emptied_module_database, name="database_url")


def request(
    message_id: str | None,
    *,
    path: bytes = b"/webhooks/s?token=t0ken",
    version: bytes = b"1.1",
    extra: bytes = b"",
    body: bytes = b'{"n": 1}',
) -> bytes:
    id_header = b"" if message_id is None else b"X-Id: " + message_id.encode() + b"\r\n"
    return (
        b"POST "
        + path
        + b" HTTP/"
        + version
        + b"\r\nHost: x\r\n"
        + id_header
        + extra
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(lines[0].split(" ")[1]), headers, body


async def test_keep_alive_and_pipelined_deliveries_are_answered_in_order(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        # One after another on one connection.
        for n in range(5):
            writer.write(request(f"seq-{n}"))
            status, headers, body = await read_answer(reader)
            assert status == 200
            assert headers["content-type"] == "application/json"
            assert json.loads(body)["message_id"] == f"seq-{n}"
        # Ten in one write: the first is served directly, the rest wait their turn.
        writer.write(b"".join(request(f"pipe-{n}") for n in range(10)))
        answers = [await read_answer(reader) for _ in range(10)]
    finally:
        writer.close()
    assert [json.loads(body)["message_id"] for _, _, body in answers] == [
        f"pipe-{n}" for n in range(10)
    ]
    assert {json.loads(body)["status"] for _, _, body in answers} == {"accepted"}
    stored = await db.fetchval("SELECT count(*) FROM inbox_messages")
    assert stored == 15


async def test_a_kept_alive_connection_gets_the_keep_alive_and_head_timeouts_from_its_response(
    server: ServerProcess, database_url: str
) -> None:
    """After a response, one timer a connection keeps both bounds: a connection that sends
    nothing is closed after the keep-alive timeout (5 s), one that begins a head and stalls is
    answered 408 when the head timeout (10 s from the response) runs out, and one that goes on
    sending requests is served past both."""
    loop = asyncio.get_running_loop()

    async def answered_then(then: bytes) -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request(f"kept-{len(then)}"))
        assert (await read_answer(reader))[0] == 200
        answered = loop.time()
        await asyncio.sleep(1)
        writer.write(then)
        rest = await asyncio.wait_for(reader.read(), 15)  # until the server closes
        writer.close()
        return loop.time() - answered, rest

    async def busy() -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        statuses = []
        for n in range(8):  # one every 1.5 s: 12 s on one connection
            writer.write(request(f"busy-{n}"))
            statuses.append((await read_answer(reader))[0])
            await asyncio.sleep(1.5)
        writer.close()
        return statuses

    (idle_after, idle_rest), (stalled_after, stalled_rest), statuses = await asyncio.gather(
        answered_then(b""),
        answered_then(b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\n"),
        busy(),
    )
    assert idle_rest == b""
    assert 4.5 <= idle_after < 8
    assert stalled_rest.startswith(b"HTTP/1.1 408"), stalled_rest
    assert 9.5 <= stalled_after < 13
    assert statuses == [200] * 8


async def test_direct_answers_are_the_asgi_routes_answers(
    server: ServerProcess, database_url: str, client_for: AppFactory
) -> None:
    cases = {
        "accepted": request("same-1"),
        "duplicate": request("same-1"),
        "no id": request(None),
        "bad token": request("t-1", path=b"/webhooks/s?token=wrong"),
        "not JSON": request("j-1", body=b"{"),
    }
    direct = {}
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        for name, raw in cases.items():
            writer.write(raw)
            direct[name] = await read_answer(reader)
    finally:
        writer.close()

    # The same requests through the ASGI app in this process, on the emptied database.
    await empty_tables(database_url)
    through_asgi = {}
    config = {"sources": {"s": {"kind": "generic", "id_header": "x-id", "token": "t0ken"}}}
    async with client_for(config) as client:
        for name, raw in cases.items():
            head, _, body = raw.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:])
            through_asgi[name] = await client.post(
                lines[0].split(" ")[1], headers=headers, content=body
            )

    for name in cases:
        status, headers, body = direct[name]
        expected = through_asgi[name]
        assert status == expected.status_code, name
        assert headers["content-type"] == expected.headers["content-type"], name
        assert json.loads(body).keys() == expected.json().keys(), name
        if status != 200:
            assert json.loads(body)["detail"] == expected.json()["detail"], name
        assert headers["x-request-id"], name


async def test_request_id_http_1_0_and_requests_the_shortcut_leaves_to_asgi(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request("rid-1", extra=b"X-Request-Id: trace-42\r\n"))
        status, headers, _ = await read_answer(reader)
        assert (status, headers["x-request-id"]) == (200, "trace-42")
        # Not taken directly, answered by the ASGI route on the same connection.
        chunked = (
            b"POST /webhooks/s?token=t0ken HTTP/1.1\r\nHost: x\r\nX-Id: chunked-1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        )
        writer.write(chunked)
        status, _, body = await read_answer(reader)
        assert (status, json.loads(body)["message_id"]) == (200, "chunked-1")
        writer.write(request("enc-1", path=b"/webhooks/%73?token=t0ken"))  # %73 is "s"
        status, _, body = await read_answer(reader)
        assert (status, json.loads(body)["message_id"]) == (200, "enc-1")
        writer.write(request("unknown-1", path=b"/webhooks/nope"))
        status, headers, _ = await read_answer(reader)
        assert (status, headers["content-type"]) == (404, "application/problem+json")
        writer.write(request("nested-1", path=b"/webhooks/s/more?token=t0ken"))  # no such route
        status, headers, _ = await read_answer(reader)
        assert (status, headers["content-type"]) == (404, "application/problem+json")
    finally:
        writer.close()

    # HTTP/1.0 without keep-alive: answered, then the connection is closed.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request("old-1", version=b"1.0"))
        status, headers, _ = await read_answer(reader)
        assert (status, headers.get("connection")) == (200, "close")
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()
    stored = {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}
    assert stored == {"rid-1", "chunked-1", "enc-1", "old-1"}


async def test_answers_carry_a_date_but_do_not_name_the_server_software(
    server: ServerProcess, database_url: str
) -> None:
    chunked = (
        b"POST /webhooks/s?token=t0ken HTTP/1.1\r\nHost: x\r\nX-Id: chunked-2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        answers = {}
        # Served directly, then through the ASGI route, then by another ASGI route.
        for name, raw in {"direct": request("srv-1"), "asgi": chunked, "health": health}.items():
            writer.write(raw)
            answers[name] = await read_answer(reader)
    finally:
        writer.close()
    for name, (status, headers, _) in answers.items():
        assert status == 200, name
        assert "server" not in headers, name
        assert headers["date"].endswith(" GMT"), name
