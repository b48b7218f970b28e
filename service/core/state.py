"""What the app shares between requests, built in the lifespan and reached through `StateDep`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.config import Settings
from service.inbox_config import InboxConfig
from service.store.group_commit import GroupCommitter


@dataclass
class AppState:
    settings: Settings
    inbox: InboxConfig
    engine: AsyncEngine
    committer: GroupCommitter
    head_revision: str | None


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.inbox
    return state


StateDep = Annotated[AppState, Depends(get_state)]
