"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from starlette.responses import Response

from service.core.migrations import current_revision
from service.core.problems import problem, problem_responses
from service.core.state import StateDep
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


@router.get("/readyz", response_model=Ready, responses=problem_responses(503))
async def readyz(state: StateDep) -> Ready | Response:
    """The database answers and its schema is at the migrations' head."""
    try:
        async with translate_errors():
            revision = await current_revision(state.engine)
    except StoreUnavailable:
        return problem(503, "database unreachable", headers={"Retry-After": "5"})
    if revision != state.head_revision:
        return problem(
            503,
            f"schema at {revision}, expected {state.head_revision}: run `webhook-inbox migrate`",
        )
    return Ready(status="ready", schema_revision=revision)
