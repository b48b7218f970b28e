"""The transport the HTTP protocol writes through: a turn's writes leave in one piece, and the
rest of the transport API is the socket's own, on uvloop's real transport over a socket pair."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import cast

import uvloop

from service.api.coalescing_transport import CoalescingTransport


class Received(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()


Check = Callable[[CoalescingTransport, Received, socket.socket], Awaitable[None]]


def over_a_socket_pair(check: Check) -> None:
    """Run `check` on uvloop with a wrapped transport and the socket at the other end."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        protocol = Received()
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, ours)
        wrapped = CoalescingTransport(transport, loop)
        try:
            await check(wrapped, protocol, theirs)
        finally:
            transport.abort()
            theirs.close()

    uvloop.run(main())


async def read_all(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < size:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, size - len(data)), 5)
        if not chunk:
            break
        data += chunk
    return data


def test_every_method_of_the_transport_api_is_its_own() -> None:
    # Not found through __getattr__ (every attribute looked up on the wrapper paid for one)
    # and not asyncio.Transport's, which raises NotImplementedError.
    api = {name for name in dir(asyncio.Transport) if not name.startswith("_")}
    assert api <= set(vars(CoalescingTransport))
    assert not hasattr(CoalescingTransport, "__getattr__")


def test_a_turns_writes_are_held_then_sent_in_order_with_a_write_now_after_them() -> None:
    async def check(wrapped: CoalescingTransport, _: Received, theirs: socket.socket) -> None:
        wrapped.write(b"HTTP/1.1 200 OK\r\n")
        wrapped.write(bytearray(b"content-length: 2\r\n\r\n"))
        wrapped.write(memoryview(b"ok"))
        assert wrapped.get_write_buffer_size() == 0  # held, not handed to the socket yet
        wrapped.write_now(b"|now")  # after what is held, in the same send
        expected = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok|now"
        assert await read_all(theirs, len(expected)) == expected
        wrapped.writelines([b"a", b"b"])
        await asyncio.sleep(0)  # the end of the turn sends what was held
        assert await read_all(theirs, 2) == b"ab"

    over_a_socket_pair(check)


def test_the_rest_of_the_api_is_the_sockets() -> None:
    async def check(wrapped: CoalescingTransport, protocol: Received, _: socket.socket) -> None:
        real = protocol.transport
        assert real is not None
        assert wrapped.get_protocol() is protocol
        assert wrapped.get_extra_info("socket") is not None
        assert wrapped.get_extra_info("no such thing", "default") == "default"
        assert wrapped.is_reading()
        wrapped.pause_reading()
        assert not wrapped.is_reading()
        assert not real.is_reading()
        wrapped.resume_reading()
        assert wrapped.is_reading()
        wrapped.set_write_buffer_limits(high=4096, low=1024)
        assert wrapped.get_write_buffer_limits() == real.get_write_buffer_limits() == (1024, 4096)
        assert wrapped.can_write_eof()
        other = Received()
        wrapped.set_protocol(other)
        assert real.get_protocol() is other
        wrapped.set_protocol(protocol)
        assert not wrapped.is_closing()

    over_a_socket_pair(check)


def test_ending_the_stream_and_closing_send_what_is_held_first() -> None:
    async def check(
        wrapped: CoalescingTransport, protocol: Received, theirs: socket.socket
    ) -> None:
        wrapped.write(b"last words")
        wrapped.write_eof()
        assert await read_all(theirs, 100) == b"last words"  # then the end of the stream
        wrapped.close()
        assert wrapped.is_closing()
        await asyncio.wait_for(protocol.lost.wait(), 5)

    over_a_socket_pair(check)


def test_closing_sends_what_is_held_and_aborting_drops_it() -> None:
    async def close(
        wrapped: CoalescingTransport, protocol: Received, theirs: socket.socket
    ) -> None:
        wrapped.write(b"held")
        wrapped.close()
        assert await read_all(theirs, 100) == b"held"
        await asyncio.wait_for(protocol.lost.wait(), 5)

    async def abort(
        wrapped: CoalescingTransport, protocol: Received, theirs: socket.socket
    ) -> None:
        wrapped.write(b"held")
        wrapped.abort()
        await asyncio.wait_for(protocol.lost.wait(), 5)
        assert await read_all(theirs, 100) == b""  # the stream ended with nothing sent

    over_a_socket_pair(close)
    over_a_socket_pair(abort)
