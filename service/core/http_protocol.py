"""uvicorn's httptools protocol with a bound on request heads, which httptools lacks."""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.core.config import MAX_REQUEST_HEAD_BYTES

log = logging.getLogger("service.http")

# How long a refused connection is drained before it is closed.
LINGER_SECONDS = 2.0

_PROBLEM = json.dumps(
    {
        "type": "about:blank",
        "title": "Request Header Fields Too Large",
        "status": 431,
        "detail": f"the request line and headers exceed {MAX_REQUEST_HEAD_BYTES} bytes",
    }
).encode()
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/problem+json\r\n"
    b"content-length: " + str(len(_PROBLEM)).encode() + b"\r\n"
    b"connection: close\r\n\r\n" + _PROBLEM
)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """Answers 431 and closes once a request's head passes `MAX_REQUEST_HEAD_BYTES`.

    httptools buffers a header until its line ends and sets no limit on a head's size, so one
    endless header (or endless headers) would grow the process's memory without bound and
    reach the app, and the stored `headers`, whole. Bytes are counted only while the head is
    unfinished after a chunk has been parsed, so a body arriving with the head never counts.
    """

    _head_bytes: int | None = 0  # None from the end of a head until the end of its message
    # A message ended inside the last chunk, so how much of it was the next head is unknown:
    # count from the next chunk (pipelined requests; the bound grows by one chunk at most).
    _ended_in_chunk = False
    _refused = False  # a 431 was sent; the connection is draining until it closes

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the rest of a refused head: read and dropped until we close
        super().data_received(data)
        if self._ended_in_chunk:
            self._ended_in_chunk = False
            return
        if self._head_bytes is None or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
            self._refuse_head()

    def _refuse_head(self) -> None:
        log.warning("request head too large; refused", extra={"limit": MAX_REQUEST_HEAD_BYTES})
        self._refused = True
        self.transport.write(_TOO_LARGE)
        # Closing with the client's bytes still unread would send a reset, which can destroy
        # the 431 before the client reads it: end our side, drop what still arrives, then
        # close after a moment (or when the client does).
        if self.transport.can_write_eof():
            self.transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0
        self._ended_in_chunk = True
