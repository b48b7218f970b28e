"""Recording deliveries: the one place ingest writes, committed before any 2xx."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import LargeBinary

from service.sources.base import Message, Recorded
from service.store.errors import translate_errors

NOTIFY_CHANNEL = "webhook_inbox"

# A conflict on (source, message_id) means the message is already recorded: do nothing, so a
# redelivery never touches the first delivery's body, headers or status.
INSERT_MESSAGE = text(
    """
    INSERT INTO inbox_messages (source, message_id, event_type, headers, body, content_type)
    VALUES (:source, :message_id, :event_type, :headers, :body, :content_type)
    ON CONFLICT (source, message_id) DO NOTHING
    RETURNING id
    """
).bindparams(bindparam("headers", type_=JSONB), bindparam("body", type_=LargeBinary))

# A separate statement (not a CTE of the insert) so that, under READ COMMITTED, it sees a row
# whose inserting transaction committed while our INSERT waited on it.
COUNT_REDELIVERY = text(
    """
    UPDATE inbox_messages
       SET receive_count = receive_count + 1, last_received_at = now()
     WHERE source = :source AND message_id = :message_id
    """
)

NOTIFY = text(f"SELECT pg_notify('{NOTIFY_CHANNEL}', :source)")


async def record_messages(
    engine: AsyncEngine,
    source: str,
    messages: Sequence[Message],
    headers: Mapping[str, str],
    body: bytes,
    content_type: str | None,
) -> list[Recorded]:
    """Insert each message unless already recorded, in one transaction committed on return.

    A message without bytes of its own (`Message.body is None`) stores the request's `body`.
    """
    results: list[Recorded] = []
    async with translate_errors(), engine.begin() as conn:
        for message in messages:
            row_id = (
                await conn.execute(
                    INSERT_MESSAGE,
                    {
                        "source": source,
                        "message_id": message.message_id,
                        "event_type": message.event_type,
                        "headers": dict(headers),
                        "body": body if message.body is None else message.body,
                        "content_type": message.content_type or content_type,
                    },
                )
            ).scalar_one_or_none()
            if row_id is None:
                await conn.execute(
                    COUNT_REDELIVERY, {"source": source, "message_id": message.message_id}
                )
                results.append(Recorded(message.message_id, "duplicate", None))
            else:
                results.append(Recorded(message.message_id, "accepted", row_id))
        if any(r.outcome == "accepted" for r in results):
            await conn.execute(NOTIFY, {"source": source})
    return results
