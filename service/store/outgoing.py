"""The outbox's SQL and its checks: one outgoing message staged as a row of `inbox_messages`
under its endpoint's source (`endpoint_source`), in the caller's transaction."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.types import LargeBinary

from service.core import tracing
from service.sources.config import DESTINATION_NAME, endpoint_source
from service.store.notifications import NOTIFY_CHANNEL

# A key is sent as a header value: printable ASCII without spaces, bounded.
MAX_KEY_LENGTH = 255
MAX_EVENT_TYPE_LENGTH = 256
_KEY = re.compile(rf"[!-~]{{1,{MAX_KEY_LENGTH}}}")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Set by the relay on every request: a caller's value would contradict them.
RESERVED_HEADERS = frozenset(
    {
        "idempotency-key",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "content-length",
        "host",
        "transfer-encoding",
        "connection",
    }
)

# One round trip: the row, and (once the transaction commits) the workers' wake-up. A key
# already staged for the endpoint inserts nothing and wakes nobody.
STAGE = text(
    f"""
    WITH staged AS (
        INSERT INTO inbox_messages (source, message_id, event_type, headers, body, content_type,
                                    trace_context)
        VALUES (:source, :message_id, :event_type, :headers, :body, :content_type,
                :trace_context)
        ON CONFLICT (source, message_id) DO NOTHING
        RETURNING id
    )
    SELECT id, pg_notify('{NOTIFY_CHANNEL}', :source) FROM staged
    """  # noqa: S608 - a constant channel, no input
).bindparams(
    bindparam("headers", type_=JSONB),
    bindparam("body", type_=LargeBinary),
    bindparam("trace_context", type_=JSONB),
)


def _body(payload: Any) -> tuple[bytes, str]:
    """The request body of `payload` and its content type: bytes and text as they are (text
    that must be UTF-8, which a signature covers), anything else as JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        body = bytes(payload)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(
                "an outgoing payload given as bytes must be UTF-8 text (JSON, XML, a form): "
                "Standard Webhooks signs text"
            ) from None
        return body, "application/octet-stream"
    if isinstance(payload, str):
        return payload.encode(), "text/plain; charset=utf-8"
    try:
        return orjson.dumps(payload), "application/json"
    except TypeError as exc:
        raise ValueError(
            f"an outgoing payload is bytes, str or JSON-serialisable ({exc}); for a pydantic "
            "model pass model.model_dump(mode='json')"
        ) from None


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's headers, lower-cased, checked as HTTP lets them through."""
    kept: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an HTTP header name")
        lowered = name.lower()
        if lowered in RESERVED_HEADERS:
            raise ValueError(f"the relay sets the {lowered} header itself; leave it out")
        if not isinstance(value, str) or not value.isprintable() or not value.isascii():
            raise ValueError(f"header {name}: a value is printable ASCII text")
        kept[lowered] = value
    return kept


def checked_key(key: str) -> str:
    """`key` as a message's key: 1-255 printable ASCII characters without spaces."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(
            f"an outgoing message's key is 1-{MAX_KEY_LENGTH} printable ASCII characters "
            f"without spaces, not {key!r}"
        )
    return key


def derived_key(source: str, message_id: str, destination: str | None, position: int) -> str:
    """The key of the `position`th (from 1) message a handler staged for an incoming message
    without a key of its own: the same in every attempt of that message, so that a retried
    handler stages the same keys (and a replay sends nothing twice). Hashed when the incoming
    message's id would not make a header value."""
    parts = [source, message_id, *([destination] if destination else []), str(position)]
    key = ":".join(parts)
    if _KEY.fullmatch(key):
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def stage_values(
    endpoint: str,
    payload: Any,
    *,
    event_type: str | None,
    key: str | None,
    headers: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The row of one outgoing message, checked; ValueError says what is wrong with it."""
    if not isinstance(endpoint, str) or not re.fullmatch(DESTINATION_NAME, endpoint):
        raise ValueError(f"{endpoint!r} is not an endpoint name ([endpoints.NAME])")
    if event_type is not None and (
        not isinstance(event_type, str)
        or not 0 < len(event_type) <= MAX_EVENT_TYPE_LENGTH
        or not event_type.isprintable()
    ):
        raise ValueError(f"an event type is 1-{MAX_EVENT_TYPE_LENGTH} printable characters")
    body, content_type = _body(payload)
    kept = _headers(headers)
    content_type = kept.pop("content-type", content_type)
    return {
        "source": endpoint_source(endpoint),
        "message_id": checked_key(key if key is not None else f"out_{uuid.uuid4().hex}"),
        "event_type": event_type,
        "headers": kept,
        "body": body,
        "content_type": content_type,
        # The trace it was staged in (a handler's attempt span), for its requests to continue.
        "trace_context": tracing.current_carrier(),
    }


def stage(session: Any, values: Mapping[str, Any]) -> None:
    """Insert `values` (`stage_values`) in the transaction of `session`: a SQLAlchemy or
    SQLModel `Session`, or a `Connection`."""
    # SQLAlchemy's own `execute`: SQLModel's warns that it prefers `exec` for a select.
    execute = Session.execute if isinstance(session, Session) else type(session).execute
    execute(session, STAGE, values)


async def stage_async(session: Any, values: Mapping[str, Any]) -> None:
    """`stage` on an `AsyncSession` (SQLAlchemy's or SQLModel's) or an `AsyncConnection`."""
    execute = AsyncSession.execute if isinstance(session, AsyncSession) else type(session).execute
    await execute(session, STAGE, values)
