"""Recording one delivery inside a transaction its caller holds, for sync mode: the processing
side opens it, records, runs the handlers and commits. Every async-mode delivery is written by
group commit (`group_commit.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.types import LargeBinary

from service.sources.base import Message, Recorded
from service.store.errors import is_refusal, refused, translate_errors
from service.store.results import MessageRow

# A conflict on (source, message_id) means the message is already recorded: do nothing, so a
# redelivery never touches the first delivery's body, headers or status.
INSERT_MESSAGE = text(
    """
    INSERT INTO inbox_messages (source, message_id, event_type, headers, body, content_type,
                                trace_context, searchable)
    VALUES (:source, :message_id, :event_type, :headers, :body, :content_type, :trace_context,
            :searchable)
    ON CONFLICT (source, message_id) DO NOTHING
    RETURNING id
    """
).bindparams(
    bindparam("headers", type_=JSONB),
    bindparam("body", type_=LargeBinary),
    bindparam("trace_context", type_=JSONB),
)

# A separate statement (not a CTE of the insert) so that, under READ COMMITTED, it sees a row
# whose inserting transaction committed while our INSERT waited on it.
COUNT_REDELIVERY = text(
    """
    UPDATE inbox_messages
       SET receive_count = receive_count + 1, last_received_at = now()
     WHERE source = :source AND message_id = :message_id
    """
)


@asynccontextmanager
async def ingest_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction committed when the block exits normally, rolled back otherwise."""
    async with translate_errors(), engine.begin() as conn:
        yield conn


async def insert_messages(
    conn: AsyncConnection,
    source: str,
    messages: Sequence[Message],
    headers: Mapping[str, str],
    body: bytes,
    content_type: str | None,
    *,
    searchable: bool = False,
) -> tuple[list[Recorded], list[MessageRow]]:
    """Insert each message unless already recorded, in the caller's transaction.

    Returns what happened to each message and the rows just inserted (status `pending`, for
    the caller to process before its commit). A message without bytes of its own
    (`Message.body is None`) stores the request's `body`. A row the database refuses raises
    `StoreRefused`.
    """
    results: list[Recorded] = []
    accepted: list[MessageRow] = []
    stored_headers = dict(headers)
    for message in messages:
        message_body = body if message.body is None else message.body
        message_type = message.content_type or content_type
        values = {
            "source": source,
            "message_id": message.message_id,
            "event_type": message.event_type,
            "headers": stored_headers,
            "body": message_body,
            "content_type": message_type,
            "trace_context": None if message.trace_context is None else dict(message.trace_context),
            "searchable": searchable,
        }
        try:
            row_id = (await conn.execute(INSERT_MESSAGE, values)).scalar_one_or_none()
        except Exception as exc:
            if is_refusal(exc):
                raise refused(exc) from exc
            raise
        if row_id is None:
            await conn.execute(
                COUNT_REDELIVERY, {"source": source, "message_id": message.message_id}
            )
            results.append(Recorded(message.message_id, "duplicate", None))
            continue
        results.append(Recorded(message.message_id, "accepted", row_id))
        accepted.append(
            MessageRow(
                row_id,
                source,
                message.message_id,
                message.event_type,
                0,
                stored_headers,
                message_body,
                message_type,
                message.trace_context,
            )
        )
    return results, accepted
