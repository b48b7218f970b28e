"""Sync mode: a delivery's handlers run inside the ingest transaction, before the 200."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.processing.attempt_spans import in_attempt_span
from service.processing.handler_api import RetryLater
from service.processing.pipeline import Pipeline
from service.processing.runner import handler_scope, run_handlers
from service.sources.base import Message, Recorded
from service.store.attempts import finish_attempts
from service.store.results import MessageRow
from service.store.sync_ingest import ingest_transaction, insert_messages

SYNC_ACTOR = f"sync:{socket.gethostname()}:{os.getpid()}"


class HandlerFailed(Exception):
    """A sync-mode handler raised: the whole ingest transaction is rolled back."""

    def __init__(self, source: str, message_id: str, retry_after: float | None) -> None:
        super().__init__(f"handler failed for {source}/{message_id}")
        self.source = source
        self.message_id = message_id
        self.retry_after = retry_after


async def record_and_process(
    engine: AsyncEngine,
    pipeline: Pipeline,
    messages: Sequence[Message],
    headers: Mapping[str, str],
    body: bytes,
    content_type: str | None,
) -> list[Recorded]:
    """Record a sync-mode delivery and run its handlers in one transaction, committed on return.

    The accepted messages are answered `processed`: their rows, attempts and the handlers'
    effects commit together. A failing handler raises `HandlerFailed` and nothing is recorded.
    """
    async with ingest_transaction(engine) as conn:
        results, accepted = await insert_messages(
            conn,
            pipeline.source,
            messages,
            headers,
            body,
            content_type,
            searchable=pipeline.search_payload,
        )
        if accepted:
            await run_in_transaction(conn, pipeline, accepted)
    return [
        Recorded(r.message_id, "processed", r.id) if r.outcome == "accepted" else r for r in results
    ]


async def run_in_transaction(
    conn: AsyncConnection, pipeline: Pipeline, rows: Sequence[MessageRow]
) -> None:
    """Run the handlers of `rows`; the first failure raises `HandlerFailed`."""
    results = []
    async with handler_scope(conn) as (session, savepoints):
        for row in rows:
            # No savepoint: the first failure rolls the whole request's transaction back.
            run = run_handlers(session, savepoints, pipeline, row, isolated=False)
            result, exc = await in_attempt_span(run, pipeline, row)
            if exc is not None:
                retry_after = exc.after_seconds if isinstance(exc, RetryLater) else None
                raise HandlerFailed(row.source, row.message_id, retry_after) from exc
            results.append(result)
        await finish_attempts(conn, results, SYNC_ACTOR, savepoints=savepoints)
