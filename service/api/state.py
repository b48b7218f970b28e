"""What the app shares between requests, built in the lifespan and reached through `StateDep`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.metrics import Metrics
from service.core.migrations import Revisions
from service.core.settings import Settings
from service.processing.pipeline import Pipeline
from service.sources.config_file import InboxConfig
from service.store.counts import EndedCounts
from service.store.group_commit import GroupCommitter
from service.store.rejections import RejectionLog

log = logging.getLogger("service.app")


class BackgroundRuns:
    """Work the app runs past the request that started it (a bulk action's batches). Kept
    referenced, as asyncio keeps only weak references to tasks, and cancelled at shutdown:
    each stops where its last committed batch left it (`store.bulk.run`)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.ended)

    def ended(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "background run failed", exc_info=task.exception(), extra={"run": task.get_name()}
            )

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@dataclass
class AppState:
    settings: Settings
    inbox: InboxConfig
    engine: AsyncEngine
    committer: GroupCommitter
    # Deliveries refused with a 4xx, on their way to `inbox_rejected_deliveries`.
    rejections: RejectionLog
    # The processed messages per source, for `/metrics` and the statistics.
    ended_counts: EndedCounts
    # The migrations' revisions: read from them by the first `/readyz`, not at start.
    revisions: Revisions | None = None
    metrics: Metrics = field(default_factory=Metrics)
    # Admin bearer tokens in force (configured or generated); never logged or answered.
    admin_tokens: list[str] = field(default_factory=list, repr=False)
    # Signs the admin listings' cursors; see `service.api.admin.cursor.cursor_key`.
    cursor_key: bytes = field(default=b"", repr=False)
    pipelines: Mapping[str, Pipeline] = field(default_factory=dict)
    # Under `serve`: the supervisor's file of live children, which `/readyz` reads.
    processing_state: Path | None = None
    background: BackgroundRuns = field(default_factory=BackgroundRuns)


async def get_state(request: Request) -> AppState:
    # async: FastAPI runs a plain `def` dependency in a thread pool, a hop per request.
    state: AppState = request.app.state.inbox
    return state


StateDep = Annotated[AppState, Depends(get_state)]
