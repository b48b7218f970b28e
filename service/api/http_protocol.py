"""uvicorn's httptools protocol with the connection bounds it lacks: head size, head timeout,
and a connection limit that idle sockets cannot exhaust."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from service.api.head_limits import MAX_REQUEST_HEAD_BYTES, REQUEST_HEAD_TIMEOUT_SECONDS
from service.api.problems import RETRY_AFTER_SECONDS, problem

log = logging.getLogger("service.http")

# How long a refused connection is drained before it is closed.
LINGER_SECONDS = 2.0
HEAD_END = b"\r\n\r\n"


def _raw_problem(status: int, title: str, detail: str) -> bytes:
    """A whole HTTP response carrying a problem document, for answers sent before any app."""
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    return (
        f"HTTP/1.1 {status} {title}\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        f"connection: close\r\n\r\n{body}"
    ).encode()


_TOO_LARGE = _raw_problem(
    431,
    "Request Header Fields Too Large",
    f"the request line and headers exceed {MAX_REQUEST_HEAD_BYTES} bytes",
)
_TOO_SLOW = _raw_problem(
    408,
    "Request Timeout",
    f"the request line and headers did not arrive within {REQUEST_HEAD_TIMEOUT_SECONDS:g} seconds",
)


async def refuse_busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer when every connection the limit allows is busy with a request."""
    response = problem(
        503,
        "the server is busy with as many requests as it takes at once; try again shortly",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Connection": "close"},
    )
    await response(scope, receive, send)


class CoalescingTransport:
    """A transport whose writes of one turn of the event loop go out in one `write`.

    uvicorn writes a response's status line and headers, then its body, as two writes: two
    send() calls, each carrying a TCP segment through the whole loopback or network stack.
    Measured with py-spy on bench/ingest, that per-response send was the HTTP process's
    largest cost (30% of its busy samples). Held until the loop's next turn, the head and the
    body of a response leave in one segment. Closing or ending the stream sends what is held
    first; everything else is the wrapped transport's own.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        if not self._held:
            return
        data = b"".join(self._held)
        self._held.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """httptools with three bounds it lacks, for a server facing the open internet:

    - A request head (request line and headers) over `MAX_REQUEST_HEAD_BYTES` is answered
      431 and never reaches the app, however it arrives: httptools buffers a header until its
      line ends and bounds nothing. Each head's end is found in the bytes before the parser
      sees them, so a head is counted exactly, whether it comes in one read with its body or
      in many.
    - A connection gets `REQUEST_HEAD_TIMEOUT_SECONDS` from its start (or from its previous
      response) to complete a head: then it is closed, with 408 if a head had begun. uvicorn
      times out only keep-alive connections that have sent nothing since a response.
    - uvicorn answers 503 once `limit_concurrency` connections are open, idle ones included,
      so idle sockets could refuse every sender. Here the limit counts requests in progress;
      when that many connections are open, a new one makes room by closing the connection
      that has waited longest for a head. Only when every allowed connection is busy with a
      request is a new request refused: 503, a problem with Retry-After.
    """

    # Connections waiting for a request head, longest-waiting first: the ones closed to make
    # room at the limit. Class-wide, as a process serves one uvicorn server.
    _awaiting_head: ClassVar[dict[BoundedHttpToolsProtocol, None]] = {}

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # Enforced here instead of by uvicorn, which counts idle connections against it.
        self.max_connections: int | None = self.limit_concurrency
        self.limit_concurrency = None
        self._head_bytes: int | None = 0  # None from the end of a head to the end of its body
        self._head_started = False  # a byte other than CR or LF of the current head arrived
        self._tail = b""  # the current head's last bytes, for an end split across two reads
        self._body_left: int | None = 0  # None: chunked, its end known to the parser alone
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False  # an error was sent; the connection drains until it closes

    # Connection lifecycle.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Flow control keeps the real transport (its buffer is what pauses writing).
        self.transport = CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
        self._await_head()
        if self.max_connections is not None:
            self._make_room(self.max_connections)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_awaiting_head()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        """Start waiting for a request head: the head timeout runs, and the connection is one
        that may be closed to make room."""
        self._stop_awaiting_head()
        self._awaiting_head[self] = None
        self._head_timer = self.loop.call_later(REQUEST_HEAD_TIMEOUT_SECONDS, self._head_timed_out)

    def _stop_awaiting_head(self) -> None:
        self._awaiting_head.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _make_room(self, limit: int) -> None:
        """Close the connections waiting longest for a head until at most `limit` are open."""
        while len(self.connections) > limit:
            oldest = next(iter(self._awaiting_head))
            if oldest is self:  # every other connection is busy with a request
                return
            oldest._stop_awaiting_head()
            # Counted out now: its connection_lost comes on a later turn of the loop.
            self.connections.discard(oldest)
            oldest.transport.close()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head_started or self._head_bytes:
            self._refuse(_TOO_SLOW, "request head not received in time; refused")
        else:
            self._stop_awaiting_head()
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn armed its keep-alive timer: the connection now waits for its next head.
        if self.timeout_keep_alive_task is not None:
            self._await_head()

    # Reading: find each head's end before the parser sees it.

    def data_received(self, data: bytes) -> None:
        position = 0
        while position < len(data) and self._reading():
            if self._head_bytes is None:
                position = self._feed_body(data, position)
                continue
            end = self._head_end(data, position)
            stop = len(data) if end < 0 else end
            self._head_bytes += stop - position
            if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
                self._refuse(_TOO_LARGE, "request head too large; refused")
                return
            super().data_received(data[position:stop])
            position = stop
            if end >= 0 and self._head_started and self._head_bytes is not None:
                # The parser did not end the head at its blank line: it will have answered
                # 400, or else this head goes on and is counted on.
                self._tail = b""

    def _reading(self) -> bool:
        """Whether this protocol still parses what arrives (not refused, closed or upgraded)."""
        return (
            not self._refused
            and not self.transport.is_closing()
            and self.transport.get_protocol() is self
        )

    def _feed_body(self, data: bytes, position: int) -> int:
        """Hand the parser the body bytes in `data` from `position`; return where they end."""
        if self._body_left is None:
            # Chunked: where the body ends is the parser's to find. A pipelined head that
            # follows in the same read is counted from the next read on, so such a head can
            # pass the bound by at most one read (256 KiB).
            super().data_received(data[position:])
            if self._head_started:  # on_message_begin: the next head began in this read
                self._tail = data[-3:]
            return len(data)
        stop = min(len(data), position + self._body_left)
        self._body_left -= stop - position
        super().data_received(data[position:stop])
        return stop

    def _head_end(self, data: bytes, position: int) -> int:
        """The index in `data` just past the current head's blank line, or -1 if it does not
        end in `data`."""
        if not self._head_started:
            # Empty lines before a request line are allowed (RFC 9112 §2.2); the parser
            # skips them, and so does the search for the head's end.
            start = position
            while start < len(data) and data[start] in b"\r\n":
                start += 1
            if start == len(data):
                return -1
            self._head_started = True
            self._tail = b""
            position = start
        if self._tail:
            joined = self._tail + data[position : position + 3]
            found = joined.find(HEAD_END)
            if found >= 0:
                return position + found + len(HEAD_END) - len(self._tail)
        found = data.find(HEAD_END, position)
        if found >= 0:
            return found + len(HEAD_END)
        self._tail = (self._tail + data[max(position, len(data) - 3) :])[-3:]
        return -1

    # Parser callbacks.

    def on_message_begin(self) -> None:
        self._head_started = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_awaiting_head()
        self._body_left = self._announced_body_length()
        if self.max_connections is None or len(self.tasks) < self.max_connections:
            super().on_headers_complete()
            return
        app, self.app = self.app, refuse_busy
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._head_bytes = 0
        self._head_started = False
        self._tail = b""
        self._body_left = 0

    def _announced_body_length(self) -> int | None:
        """The body's length from Content-Length (0 without one), or None when chunked."""
        length = 0
        for name, value in self.headers:
            if name == b"transfer-encoding":
                return None
            if name == b"content-length":
                length = int(value)  # the parser has already refused one that is not digits
        return length

    def _refuse(self, answer: bytes, event: str) -> None:
        """Send `answer` (an error) and close, reading nothing more from this connection."""
        log.warning(event, extra={"client": self.client and self.client[0]})
        self._refused = True
        self._stop_awaiting_head()
        self.transport.write(answer)
        # Closing with the client's bytes still unread would send a reset, which can destroy
        # the answer before the client reads it: end our side, drop what still arrives, then
        # close after a moment (or when the client does).
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()
