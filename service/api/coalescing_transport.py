"""The transport the HTTP protocol writes through: a turn's writes leave in one piece."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class CoalescingTransport(asyncio.Transport):
    """A transport whose writes of one turn of the event loop go out in one `write`.

    uvicorn writes a response's status line and headers, then its body, as two writes: two
    send() calls, each carrying a TCP segment through the whole loopback or network stack.
    Measured with py-spy on bench/ingest, that per-response send was the HTTP process's
    largest cost (30% of its busy samples). Held until the loop's next turn, the head and the
    body of a response leave in one segment. Closing or ending the stream sends what is held
    first, and aborting it drops what is held.

    The rest of `asyncio.Transport` is the wrapped transport's own, each method spelled out:
    with a `__getattr__` to find them instead, every attribute looked up on this object (its
    own `_held` and `_transport` included) went through a slower lookup: about 7,400
    instructions a delivery (docs/benchmarks-log.md).
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def flush(self) -> None:
        if not self._held:
            return
        data = b"".join(self._held)
        self._held.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def write_now(self, data: bytes) -> None:
        """Write `data` at once, after anything held: a whole response needs no coalescing."""
        if self._held:
            self._held.append(data)
            self.flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._transport.abort()

    # The wrapped transport's own.

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()
