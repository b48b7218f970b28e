"""Liveness and readiness probes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi import APIRouter
from pydantic import BaseModel
from starlette.responses import Response

from service.api.problems import problem, problem_responses
from service.api.state import AppState, StateDep
from service.core.migrations import current_revision, head_revision
from service.store.errors import StoreUnavailable, translate_errors

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    schema_revision: str | None


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is alive and serving HTTP."""
    return Health(status="ok")


def processing_down(state_file: Path | None) -> bool:
    """Under `serve`: processing processes are expected and none is alive right now."""
    if state_file is None:
        return False
    try:
        children = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return False  # not written yet, or the supervisor is gone (SIGTERM drains us too)
    return bool(children.get("processing_expected")) and not children.get("processing_alive")


async def expected_revision(state: AppState) -> str | None:
    """The migrations' head, read once: on the first `/readyz`, in a thread, since reading it
    imports Alembic, which most HTTP processes would otherwise load at start for nothing."""
    if state.head_revision is None:
        state.head_revision = await asyncio.to_thread(head_revision)
    return state.head_revision


@router.get("/readyz", response_model=Ready, responses=problem_responses(503))
async def readyz(state: StateDep) -> Ready | Response:
    """The database answers, its schema is at head, and (under `serve`) a worker is alive."""
    if processing_down(state.processing_state):
        return problem(
            503,
            "no processing process is alive: deliveries are still accepted and stored, but "
            "none is processed until the supervisor has restarted one (see its log)",
            headers={"Retry-After": "5"},
        )
    try:
        async with translate_errors():
            revision = await current_revision(state.engine)
    except StoreUnavailable:
        return problem(503, "database unreachable", headers={"Retry-After": "5"})
    expected = await expected_revision(state)
    if revision != expected:
        return problem(
            503, f"schema at {revision}, expected {expected}: run `webhook-inbox migrate`"
        )
    return Ready(status="ready", schema_revision=revision)
