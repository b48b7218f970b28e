"""Bulk actions as recorded operations: retry, replay, discard or replay to one destination
every message a search matches, audited in `inbox_bulk_actions` and resumable.

`start` counts the matches and records the action with the walk's bound (the highest id
matched); `run` walks it in batches (`store.admin.in_batches`), each batch's progress written in
the transaction that changes its messages, so the row never claims more or less than what
committed; `resume` hands an action whose runner died or was stopped to a new runner, which
`run` continues after the last committed batch. A batch's progress is fenced on the position
it started from: of two runners that ever walk one action, only one commits each batch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, assert_never

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.status import BulkAction, BulkActionStatus
from service.store.admin import (
    BULK_BATCH_SIZE,
    BULK_REPLAY_DEFAULT_STATUSES,
    BatchWalk,
    MessageFilter,
    count_matching,
    discard_walk,
    in_batches,
    retry_walk,
)
from service.store.destinations import destination_replay_walk
from service.store.errors import translate_errors

# A running action whose heartbeat (`updated_at`, touched by each batch, which takes well under
# a second) is older than this has lost its runner: killed, or its machine lost. Resuming one
# sooner is refused, so that an operator does not race a runner that is alive.
STALE_AFTER_SECONDS = 30

COLUMNS = """
    id, action, destination, query, actor, status, matched, done, after_id, last_id,
    created_at, updated_at, finished_at
"""
RECORD = text(
    f"""
    INSERT INTO inbox_bulk_actions (action, destination, query, actor, status, matched,
                                    last_id, finished_at)
    VALUES (:action, :destination, CAST(:query AS jsonb), :actor, :status, :matched,
            :last_id, CASE WHEN :status = 'finished' THEN now() END)
    RETURNING {COLUMNS}
    """  # noqa: S608 - fixed columns
)
GET = text(f"SELECT {COLUMNS} FROM inbox_bulk_actions WHERE id = :id")  # noqa: S608
LIST = text(
    f"SELECT {COLUMNS} FROM inbox_bulk_actions ORDER BY id DESC LIMIT :limit"  # noqa: S608
)
# A batch's progress, in its transaction. Fenced on the position the batch started from (and
# on the action still running): a batch of a runner that another has taken over since updates
# nothing, and is rolled back with its changes (`TakenOver`).
ADVANCE = text(
    """
    UPDATE inbox_bulk_actions
       SET after_id = :last, done = done + :n, updated_at = now()
     WHERE id = :id AND after_id = :after AND status = 'running'
    """
)
FINISH = text(
    f"""
    UPDATE inbox_bulk_actions
       SET status = 'finished', after_id = coalesce(last_id, 0), updated_at = now(),
           finished_at = now()
     WHERE id = :id AND after_id = :after AND status = 'running'
    RETURNING {COLUMNS}
    """  # noqa: S608
)
INTERRUPT = text(
    """
    UPDATE inbox_bulk_actions SET status = 'interrupted', updated_at = now()
     WHERE id = :id AND after_id = :after AND status = 'running'
    """
)
# Taken over by a new runner: one that was stopped, or whose runner's heartbeat went stale.
TAKE_OVER = text(
    f"""
    UPDATE inbox_bulk_actions SET status = 'running', updated_at = now()
     WHERE id = :id
       AND (status = 'interrupted'
            OR (status = 'running'
                AND updated_at < now() - make_interval(secs => :stale)))
    RETURNING {COLUMNS}
    """  # noqa: S608
)
HEARTBEAT_AGE = text(
    "SELECT extract(epoch FROM now() - updated_at) FROM inbox_bulk_actions WHERE id = :id"
)


class ActionNotFound(Exception):
    """No bulk action has that id."""


class ResumeRefused(Exception):
    """The action is finished, or its runner is alive; `detail` says which."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class TakenOver(Exception):
    """Another runner resumed the action: this one's batch is rolled back and it stops."""


@dataclass(frozen=True)
class BulkActionRow:
    """An `inbox_bulk_actions` row."""

    id: int
    action: BulkAction
    destination: str | None
    query: dict[str, Any]
    actor: str
    status: BulkActionStatus
    matched: int
    done: int
    after_id: int
    last_id: int | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, row: Row[Any]) -> BulkActionRow:
        values = dict(row._mapping)
        query = values["query"]
        return cls(
            **{
                **values,
                "action": BulkAction(values["action"]),
                "status": BulkActionStatus(values["status"]),
                "query": json.loads(query) if isinstance(query, str) else query,
            }
        )


@dataclass(frozen=True)
class BulkRequest:
    """What a bulk action does: `action` to the messages `filters` match (the search, as the
    admin API's `to_filter` made it), to `destination` for a `replay_destination`."""

    action: BulkAction
    filters: MessageFilter
    destination: str | None = None

    def walk(self, actor: str) -> BatchWalk | None:
        """Its batches, as the action's own bulk function walks them; None when no status it
        may change is asked for (nothing can match)."""
        match self.action:
            case BulkAction.RETRY:
                return retry_walk(self.filters, actor, force=False)
            case BulkAction.REPLAY:
                statuses = self.filters.statuses or BULK_REPLAY_DEFAULT_STATUSES
                return retry_walk(replace(self.filters, statuses=statuses), actor, force=True)
            case BulkAction.DISCARD:
                return discard_walk(self.filters, actor)
            case BulkAction.REPLAY_DESTINATION:
                if self.destination is None:
                    raise ValueError("a replay to a destination names the destination")
                return destination_replay_walk(self.filters, self.destination, actor)
            case _:
                assert_never(self.action)


async def count(engine: AsyncEngine, request: BulkRequest, actor: str) -> int:
    """How many messages the action would change now: a dry run, which records nothing."""
    walk = request.walk(actor)
    if walk is None:
        return 0
    async with translate_errors():
        matched, _ = await count_matching(engine, walk.where, walk.params, walk.search)
    return matched


async def start(
    engine: AsyncEngine, request: BulkRequest, query: Mapping[str, Any], actor: str
) -> BulkActionRow:
    """Count the matches and record the action, `running` with its walk's bound, or at once
    `finished` when nothing matched. `query`: the filters as the operator gave them."""
    walk = request.walk(actor)
    async with translate_errors():
        matched, last_id = (
            (0, None)
            if walk is None
            else await count_matching(engine, walk.where, walk.params, walk.search)
        )
        async with engine.begin() as conn:
            row = (
                await conn.execute(
                    RECORD,
                    {
                        "action": request.action.value,
                        "destination": request.destination,
                        "query": json.dumps(query, sort_keys=True),
                        "actor": actor,
                        "status": (
                            BulkActionStatus.RUNNING
                            if last_id is not None
                            else BulkActionStatus.FINISHED
                        ),
                        "matched": matched,
                        "last_id": last_id,
                    },
                )
            ).one()
    return BulkActionRow.of(row)


Progress = Callable[[BulkActionRow], Awaitable[None] | None]


async def run(
    engine: AsyncEngine,
    action: BulkActionRow,
    request: BulkRequest,
    *,
    batch_size: int = BULK_BATCH_SIZE,
    on_progress: Progress | None = None,
) -> BulkActionRow:
    """Walk a running action from its position to its bound, a committed batch at a time,
    and mark it finished; `on_progress` is told of each batch once it committed. Cancelled
    (shutdown, Ctrl-C), it marks the action `interrupted` where its last batch left it and
    re-raises. Taken over by another runner, it stops and answers the action as it is."""
    walk = request.walk(action.actor)
    position = action.after_id
    done = action.done

    async def advance(conn: AsyncConnection, batch: Row[Any]) -> None:
        params = {"id": action.id, "after": position, "last": int(batch.last), "n": int(batch.n)}
        if not (await conn.execute(ADVANCE, params)).rowcount:
            raise TakenOver(action.id)

    try:
        if walk is not None and action.last_id is not None:
            async with translate_errors():
                batches = in_batches(
                    engine, walk, action.last_id, batch_size, after=position, on_batch=advance
                )
                async for batch in batches:
                    position, done = int(batch.last), done + int(batch.n)
                    if on_progress is not None:
                        told = on_progress(replace(action, after_id=position, done=done))
                        if told is not None:
                            await told
        async with translate_errors(), engine.begin() as conn:
            finished = (
                await conn.execute(FINISH, {"id": action.id, "after": position})
            ).one_or_none()
        if finished is None:  # finished at its start (nothing matched), or taken over
            raise TakenOver(action.id)
    except TakenOver:
        return await get(engine, action.id)
    except asyncio.CancelledError:
        # Not cancellable itself: the row must say the walk stopped, or it would wait out
        # STALE_AFTER_SECONDS before it can be resumed.
        await asyncio.shield(interrupt(engine, action.id, position))
        raise
    return BulkActionRow.of(finished)


async def interrupt(engine: AsyncEngine, action_id: int, position: int) -> None:
    """Mark an action its runner stopped at `position` as `interrupted`, to be resumed."""
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(INTERRUPT, {"id": action_id, "after": position})


async def resume(engine: AsyncEngine, action_id: int) -> BulkActionRow:
    """Take over an action to `run` it on from where its last batch left it: an interrupted
    one, or a running one whose runner's heartbeat is stale. A finished one, or one whose
    runner is alive, is refused (`ResumeRefused`)."""
    async with translate_errors(), engine.begin() as conn:
        row = (
            await conn.execute(TAKE_OVER, {"id": action_id, "stale": STALE_AFTER_SECONDS})
        ).one_or_none()
        if row is not None:
            return BulkActionRow.of(row)
        age = (await conn.execute(HEARTBEAT_AGE, {"id": action_id})).scalar()
    current = await get(engine, action_id)
    if current.status == BulkActionStatus.FINISHED:
        raise ResumeRefused(f"bulk action {action_id} is finished: nothing is left to do")
    raise ResumeRefused(
        f"bulk action {action_id} is running: its runner's last batch was {float(age or 0):.0f} s "
        f"ago; it can be resumed once that is {STALE_AFTER_SECONDS} s, if it has died"
    )


async def get(engine: AsyncEngine, action_id: int) -> BulkActionRow:
    async with translate_errors(), engine.connect() as conn:
        row = (await conn.execute(GET, {"id": action_id})).one_or_none()
    if row is None:
        raise ActionNotFound(action_id)
    return BulkActionRow.of(row)


async def list_actions(engine: AsyncEngine, limit: int) -> list[BulkActionRow]:
    """The audit: the latest `limit` bulk actions, newest first."""
    async with translate_errors(), engine.connect() as conn:
        return [BulkActionRow.of(r) for r in await conn.execute(LIST, {"limit": limit})]
