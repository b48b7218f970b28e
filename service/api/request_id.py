"""A request id for every HTTP request: taken from `X-Request-Id` or made, logged, echoed back.

Written here rather than taken from asgi-correlation-id: the ingest path runs before any
middleware (`service.api.ingest.serve_ingest`, measured with bench/ingest), so a middleware
library would cover only the other routes and ingest would still need `request_id_of`. The
library's default also replaces every id that is not a UUID4, which most proxies' ids are not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from random import getrandbits

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.logging import REQUEST_ID

_ACCEPTABLE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_of(raw_headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The sender's `X-Request-Id` when it is a sane token, else a new random id."""
    for name, value in raw_headers:
        if name == b"x-request-id":
            text: str = value.decode("latin-1")
            if _ACCEPTABLE.match(text):
                return text
            break
    # A correlation id, not a secret: 128 bits from `random` (reseeded in every forked child),
    # a third of os.urandom's cost, which is a system call on every request.
    return getrandbits(128).to_bytes(16).hex()


class RequestIdMiddleware:
    """Pure ASGI (no per-request Starlette objects) so it costs the hot path almost nothing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope["headers"])
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
