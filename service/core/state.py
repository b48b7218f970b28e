"""What the app shares between requests, built in the lifespan and reached through `StateDep`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.config import Settings
from service.inbox_config import InboxConfig
from service.processing.pipeline import Pipeline


@dataclass
class AppState:
    settings: Settings
    inbox: InboxConfig
    engine: AsyncEngine
    head_revision: str | None
    pipelines: Mapping[str, Pipeline] = field(default_factory=dict)


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.inbox
    return state


StateDep = Annotated[AppState, Depends(get_state)]
