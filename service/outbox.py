"""The outbox: outgoing messages staged in a transaction and sent once it commits.

`ctx.outbox.send(...)` in a handler, or `send(session, ...)` / `await send_async(session, ...)`
on a session of your own application, inserts an outgoing message in the caller's
transaction: it exists once that transaction commits, and never if it rolls back. The worker
then POSTs it to its endpoint (`[endpoints.NAME]` in the sources file) at least once, each
request carrying the message's key as `Idempotency-Key` and `webhook-id`, so that the receiver
drops a repeat (docs/outbox.md).

An outgoing message is a row of `inbox_messages` under the source `outbox:ENDPOINT`, its key
the row's `message_id`: it has the life an incoming message has (pending, retrying, processed,
dead), the same claims, gates, retries and dead letters, and the same admin. Staging a key
already staged for the endpoint stages nothing (the first one is sent, once).

This module is what a user's application imports: it needs SQLAlchemy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.sources.config import endpoint_of, endpoint_source
from service.store.outgoing import derived_key, stage, stage_async, stage_values

__all__ = ["derived_key", "endpoint_of", "endpoint_source", "send", "send_async", "stage_values"]


def send(
    session: Any,
    endpoint: str,
    payload: Any,
    *,
    event_type: str | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """Stage an outgoing message to `endpoint` in `session`'s transaction (a SQLAlchemy or
    SQLModel `Session`, or a `Connection`, on the inbox's database); its key.

    Sent once the transaction commits; never if it rolls back. `payload`: bytes or str as
    they are, anything else as JSON. `key`: its `Idempotency-Key` and `webhook-id` (by
    default a new random one); a key already staged for the endpoint stages nothing.
    `headers`: sent with it. Raises ValueError, staging nothing, for a bad argument.
    """
    values = stage_values(endpoint, payload, event_type=event_type, key=key, headers=headers)
    stage(session, values)
    return str(values["message_id"])


async def send_async(
    session: Any,
    endpoint: str,
    payload: Any,
    *,
    event_type: str | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """`send` on an `AsyncSession` (SQLAlchemy's or SQLModel's) or an `AsyncConnection`."""
    values = stage_values(endpoint, payload, event_type=event_type, key=key, headers=headers)
    await stage_async(session, values)
    return str(values["message_id"])
