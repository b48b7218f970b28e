"""Sync mode: a delivery's handlers run inside the ingest transaction, before the 200."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from service.processing.api import RetryLater
from service.processing.pipeline import Pipeline
from service.processing.runner import run_handlers
from service.store.processing import (
    MessageRow,
    finish_attempts,
    handler_session,
    message_savepoints,
)

SYNC_ACTOR = f"sync:{socket.gethostname()}:{os.getpid()}"


class HandlerFailed(Exception):
    """A sync-mode handler raised: the whole ingest transaction is rolled back."""

    def __init__(self, source: str, message_id: str, retry_after: float | None) -> None:
        super().__init__(f"handler failed for {source}/{message_id}")
        self.source = source
        self.message_id = message_id
        self.retry_after = retry_after


class SyncProcessor:
    """The ingest hook for a sync-mode source: run handlers on the just-inserted rows."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def __call__(self, conn: AsyncConnection, rows: Sequence[MessageRow]) -> None:
        session = handler_session(conn)
        savepoints = await message_savepoints(conn)
        try:
            results = []
            for row in rows:
                result, exc = await run_handlers(session, savepoints, self.pipeline, row)
                if exc is not None:
                    retry_after = exc.after_seconds if isinstance(exc, RetryLater) else None
                    raise HandlerFailed(row.source, row.message_id, retry_after) from exc
                results.append(result)
            await savepoints.flush()
            await finish_attempts(conn, results, SYNC_ACTOR)
        finally:
            await session.close()
