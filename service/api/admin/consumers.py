"""Admin route over the broker consumers: each consumer process's state, from every host."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from service.api.admin.models import ConsumerInfo, ConsumerList
from service.api.state import StateDep
from service.store.consumers import list_consumers

router = APIRouter(tags=["admin: operations"])


@router.get("/consumers", response_model=ConsumerList)
async def consumers(state: StateDep) -> ConsumerList:
    """List each broker consumer process by source: connected, state, lag, messages settled;
    `stale` when it has not written its row for 15 s."""
    return ConsumerList(consumers=await consumer_infos(state))


async def consumer_infos(state: StateDep) -> list[ConsumerInfo]:
    return [ConsumerInfo(**asdict(row)) for row in await list_consumers(state.engine)]
