"""Liveness and readiness probes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import Response

from service.api.problems import problem, problem_responses
from service.api.state import AppState, StateDep
from service.core.migrations import Revisions, current_revision, revisions
from service.sources.brokers import BrokerSource
from service.store.consumers import FRESH_SECONDS, consumers_by_source
from service.store.errors import StoreUnavailable, translate_errors

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    schema_revision: str | None
    warnings: list[str] = Field(
        default_factory=list,
        description="What the configuration starts with but likely did not mean, one line "
        "each, as logged at start: a `generic` source that accepts unsigned deliveries.",
    )
    consumers: dict[str, int] = Field(
        default_factory=dict,
        description="Per broker source, its consumer processes connected to the broker now "
        f"(`inbox_consumers` rows connected and written in the last {FRESH_SECONDS:.0f} s); "
        "readyz is not ready while one has none.",
    )


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


async def release_revisions(state: AppState) -> Revisions:
    """The migrations' revisions, read once: on the first `/readyz`, in a thread, since reading
    them imports Alembic, which most HTTP processes would otherwise load at start for nothing."""
    if state.revisions is None:
        state.revisions = await asyncio.to_thread(revisions)
    return state.revisions


@router.get("/readyz", response_model=Ready, responses=problem_responses(503))
async def readyz(state: StateDep) -> Ready | Response:
    """The database answers, its schema is at head, (under `serve`) a worker is alive, and each
    broker source has a consumer connected."""
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
    expected = await release_revisions(state)
    if revision is not None and revision not in expected.known:
        return problem(
            503,
            f"schema at {revision}, newer than this release knows (its newest is "
            f"{expected.head}): a newer release migrated the database",
        )
    if revision != expected.head:
        return problem(
            503, f"schema at {revision}, expected {expected.head}: run `webhook-inbox migrate`"
        )
    brokers = sorted(n for n, s in state.inbox.sources.items() if isinstance(s, BrokerSource))
    consumers: dict[str, int] = {}
    if brokers:
        try:
            found = await consumers_by_source(state.engine)
        except StoreUnavailable:
            return problem(503, "database unreachable", headers={"Retry-After": "5"})
        consumers = {name: found[name].connected if name in found else 0 for name in brokers}
        idle = [name for name, connected in consumers.items() if not connected]
        if idle:
            return problem(
                503,
                f"no consumer of broker source {', '.join(idle)} is connected: its messages "
                "wait on the broker (see GET /admin/consumers and the consumers' log)",
                headers={"Retry-After": "5"},
            )
    warnings = [f"source {name} {warning}" for name, warning in state.inbox.warnings().items()]
    return Ready(status="ready", schema_revision=revision, warnings=warnings, consumers=consumers)
