"""uvicorn's httptools protocol with the connection bounds it lacks (head size, head timeout,
a connection limit that idle sockets cannot exhaust), serving plain deliveries without ASGI."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from starlette.responses import Response
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from service.api.coalescing_transport import CoalescingTransport
from service.api.head_limits import MAX_REQUEST_HEAD_BYTES, REQUEST_HEAD_TIMEOUT_SECONDS
from service.api.ingest import DirectIngest
from service.api.problems import RETRY_AFTER_SECONDS, problem
from service.api.request_id import request_id_of

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


WEBHOOKS = b"/webhooks/"


class _NoEvent:
    """uvicorn sets its cycle's `message_event` when the connection goes; nothing waits here."""

    def set(self) -> None:
        pass


@dataclass(eq=False)
class DirectRequest:
    """A delivery served without ASGI, standing where uvicorn keeps its request cycle (it
    reads `response_complete`, `keep_alive` and `disconnected`, and sets `message_event`)."""

    ingestion: DirectIngest
    source: str
    headers: list[tuple[bytes, bytes]]
    query_string: bytes
    keep_alive: bool
    started: float
    chunks: list[bytes] = field(default_factory=list)
    body_timer: asyncio.TimerHandle | None = None
    response_complete: bool = False
    disconnected: bool = False
    message_event: _NoEvent = field(default_factory=_NoEvent)


class _DefaultHeadersBytes:
    """uvicorn's default headers (`date`, `server`) as the bytes of their lines, made once a
    list: uvicorn puts a new list in `server_state.default_headers` when the second (and so
    the date) changes, and never changes a list it has handed out."""

    def __init__(self) -> None:
        self._of: list[tuple[bytes, bytes]] | None = None
        self._lines = b""

    def __call__(self, default_headers: list[tuple[bytes, bytes]]) -> bytes:
        if default_headers is not self._of:
            self._lines = b"".join(b"%s: %s\r\n" % pair for pair in default_headers)
            self._of = default_headers
        return self._lines


_default_header_lines = _DefaultHeadersBytes()


def response_bytes(
    response: Response,
    request_id: str,
    default_headers: list[tuple[bytes, bytes]],
    *,
    keep_alive: bool,
) -> bytes:
    """The whole HTTP/1.1 response for `response` (status line, headers, body) in one piece."""
    parts = [STATUS_LINE[response.status_code], _default_header_lines(default_headers)]
    for name, value in response.raw_headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (b"x-request-id: ", request_id.encode("latin-1"), b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", bytes(response.body))
    return b"".join(parts)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """httptools with three bounds it lacks, for a server facing the open internet:

    - A request head (request line and headers) over `MAX_REQUEST_HEAD_BYTES` is answered
      431 and never reaches the app, however it arrives: httptools buffers a header until its
      line ends and bounds nothing. Each head's end is found in the bytes before the parser
      sees them, so a head is counted exactly, whether it comes in one read with its body or
      in many.
    - A connection gets `REQUEST_HEAD_TIMEOUT_SECONDS` from its start (or from its previous
      response) to complete a head: then it is closed, with 408 if a head had begun. uvicorn
      times out only keep-alive connections that have sent nothing since a response; that
      timeout (`timeout_keep_alive`) is kept here too, on the same timer.
    - uvicorn answers 503 once `limit_concurrency` connections are open, idle ones included,
      so idle sockets could refuse every sender. Here the limit counts requests in progress;
      when that many connections are open, a new one makes room by closing the connection
      that has waited longest for a head. Only when every allowed connection is busy with a
      request is a new request refused: 503, a problem with Retry-After.

    And one shortcut: a plain delivery (`POST /webhooks/{source}` for a configured source,
    with a Content-Length within the body limit) is handed to the app's `direct_ingest`
    with its head and body as parsed here, and its answer written in one piece, instead of
    going through an ASGI request cycle, middleware and Starlette's request and response
    objects. Measured with bench/ingest, that machinery cost more CPU than verifying and
    recording the delivery. Everything else is served through ASGI as before.
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
        # While waiting for a head (in `_awaiting_head`): closed at the idle deadline if no byte
        # of one has come, 408 at the head deadline if one has begun (`_await_head`). One timer
        # a connection.
        self._idle_deadline = 0.0
        self._head_deadline = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._refused = False  # an error was sent; the connection drains until it closes
        self._direct: DirectRequest | None = None  # a direct delivery whose body is arriving

    # Connection lifecycle.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Flow control keeps the real transport (its buffer is what pauses writing), and so do
        # the checks of every read and answer below: asked through the wrapper, each was one
        # more Python call.
        self._socket = transport
        self._coalescing = CoalescingTransport(transport, self.loop)
        self.transport = self._coalescing
        self._await_head(REQUEST_HEAD_TIMEOUT_SECONDS)
        if self.max_connections is not None:
            self._make_room(self.max_connections)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_awaiting_head()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        direct, self._direct = self._direct, None
        if direct is not None:  # gone before its whole body came: nothing was recorded
            self._stop_body_timer(direct)
            direct.ingestion.disconnected(direct.source, direct.started)
        super().connection_lost(exc)

    def _await_head(self, idle_seconds: float) -> None:
        """Start waiting for a request head: the connection is closed if no byte of one comes
        within `idle_seconds` (the keep-alive timeout after a response), answered 408 if one has
        begun but not ended within `REQUEST_HEAD_TIMEOUT_SECONDS`, and until then is one that
        may be closed to make room.

        One timer a connection keeps both deadlines, moved on when it fires before they pass,
        instead of timers set and cancelled for every request (this one's and uvicorn's
        keep-alive timer, which it replaces: 5.8 us of CPU a request on this machine).
        """
        self._awaiting_head.pop(self, None)  # to the end: the longest-waiting come first
        self._awaiting_head[self] = None
        now = self.loop.time()
        self._idle_deadline = now + idle_seconds
        self._head_deadline = now + REQUEST_HEAD_TIMEOUT_SECONDS
        timer = self._deadline_timer
        if timer is None or timer.when() > self._idle_deadline:
            # A connection's first response moves its idle deadline earlier (the keep-alive
            # timeout is shorter than the head timeout it began with); later ones move it on.
            if timer is not None:
                timer.cancel()
            self._deadline_timer = self.loop.call_at(self._idle_deadline, self._deadline_reached)

    def _stop_awaiting_head(self) -> None:
        self._awaiting_head.pop(self, None)

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

    def _deadline_reached(self) -> None:
        self._deadline_timer = None
        if self._refused or self.transport.is_closing():
            return
        now = self.loop.time()
        if self not in self._awaiting_head:  # a request is in progress: look again later
            self._deadline_timer = self.loop.call_at(
                now + self.timeout_keep_alive, self._deadline_reached
            )
            return
        begun = self._head_started or bool(self._head_bytes)
        deadline = self._head_deadline if begun else self._idle_deadline
        if now < deadline:  # the deadline moved on since the timer was set
            self._deadline_timer = self.loop.call_at(deadline, self._deadline_reached)
        elif begun:
            self._refuse(_TOO_SLOW, "request head not received in time; refused")
        else:
            self._stop_awaiting_head()
            self.transport.close()

    def on_response_complete(self) -> None:
        # uvicorn's own, without its keep-alive timer: `_await_head` keeps that deadline.
        self.server_state.total_requests += 1
        if self._socket.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # a pipelined request waited for this response: it starts now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._await_head(self.timeout_keep_alive)

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
        direct = self._direct
        if direct is not None and direct.body_timer is None:
            # A direct delivery's body is still to come: its time starts now. (Nearly every
            # body comes in the read that ends its head, and then no timer is set at all.)
            direct.body_timer = self.loop.call_later(
                direct.ingestion.body_timeout_seconds, self._body_timed_out
            )

    def _reading(self) -> bool:
        """Whether this protocol still parses what arrives (not refused, closed or upgraded)."""
        return (
            not self._refused
            and not self._socket.is_closing()
            and self._socket.get_protocol() is self
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
        # uvicorn's own, less the ASGI scope it makes for every request: a direct delivery never
        # reads one, so `_begin_scope` makes it once the head shows the request goes to ASGI.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def _begin_scope(self) -> None:
        """The ASGI scope of this request, as uvicorn's `on_message_begin` makes it, over the
        URL and headers parsed since."""
        url, headers, expect_100_continue = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.headers, self.expect_100_continue = url, headers, expect_100_continue
        self.scope["headers"] = headers

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_awaiting_head()
        self._body_left = self._announced_body_length()
        if self._take_directly():
            return
        self._begin_scope()
        if self.max_connections is None or len(self.tasks) < self.max_connections:
            super().on_headers_complete()
            return
        app, self.app = self.app, refuse_busy
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        if self._direct is not None:
            self._direct.chunks.append(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        direct, self._direct = self._direct, None
        if direct is not None:
            self._stop_body_timer(direct)
            # As uvloop's create_task makes a task when no task factory is set (none is), but
            # named at once: Python 3.11's C Task formats a "Task-<n>" name for every task
            # made without one, and uvloop names its tasks only after making them.
            task = asyncio.Task(
                self._answer_directly(direct), loop=self.loop, name="webhook-inbox delivery"
            )
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
        else:
            super().on_message_complete()
        self._head_bytes = 0
        self._head_started = False
        self._tail = b""
        self._body_left = 0

    # Deliveries served without ASGI.

    def _direct_ingestion(self) -> DirectIngest | None:
        """The app's direct ingest while it runs (None: not started, stopping, or another app)."""
        ingestion: DirectIngest | None = getattr(self.config.app, "direct_ingest", None)
        return ingestion

    def _take_directly(self) -> bool:
        """Start serving this request as a direct delivery, if it is a plain one."""
        ingestion = self._direct_ingestion()
        if ingestion is None or self.parser.get_method() != b"POST":
            return False
        path, _, query_string = self.url.partition(b"?")
        if not path.startswith(WEBHOOKS):
            return False
        name = path[len(WEBHOOKS) :]
        if not name or not name.isascii():
            return False
        source = name.decode("ascii")
        # Looked for in the text: `b"%" in name` first tries b"%" as an integer, and CPython
        # makes and drops a TypeError, with its message formatted, before it searches.
        if "%" in source or "/" in source:
            return False
        length = self._body_left
        if (
            not ingestion.takes(source)
            or length is None  # chunked
            or length > ingestion.max_body_bytes  # 413, before the body is read, by ASGI
            or self.expect_100_continue
            or self.parser.should_upgrade()
            # A pipelined request waits for the one before it: uvicorn queues it.
            or (self.cycle is not None and not self.cycle.response_complete)
            or (self.max_connections is not None and len(self.tasks) >= self.max_connections)
        ):
            return False
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        direct = DirectRequest(
            ingestion, source, self.headers, query_string, keep_alive, time.perf_counter()
        )
        # Its body timer is set at the end of the read, if the body is not complete by then.
        self.cycle = direct  # type: ignore[assignment]
        self._direct = direct
        return True

    @staticmethod
    def _stop_body_timer(direct: DirectRequest) -> None:
        if direct.body_timer is not None:
            direct.body_timer.cancel()
            direct.body_timer = None

    def _body_timed_out(self) -> None:
        direct, self._direct = self._direct, None
        if direct is None:
            return
        direct.body_timer = None
        response = direct.ingestion.body_timed_out(direct.source, direct.started)
        direct.response_complete = True
        answer = response_bytes(
            response,
            request_id_of(direct.headers),
            self.server_state.default_headers,
            keep_alive=False,
        )
        self._refused = True
        self._send_and_close(answer)

    async def _answer_directly(self, direct: DirectRequest) -> None:
        body = b"".join(direct.chunks)
        response, request_id = await direct.ingestion.answer(
            direct.source, direct.headers, direct.query_string, body, direct.started
        )
        direct.response_complete = True
        if self._socket.is_closing():  # the client left; its delivery may be recorded
            return
        keep_alive = direct.keep_alive and not self._shutting_down()
        answer = response_bytes(
            response, request_id, self.server_state.default_headers, keep_alive=keep_alive
        )
        self._coalescing.write_now(answer)
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()

    def _shutting_down(self) -> bool:
        # uvicorn's shutdown() clears the keep-alive of a cycle in flight.
        return self.cycle is not None and not self.cycle.keep_alive

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
        self._send_and_close(answer)

    def _send_and_close(self, answer: bytes) -> None:
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
