"""Flow state, shared by every process on the database: each gated (source, destination)'s
rate-limit bucket (0013) and circuit breaker (0014), and each source's pause (0011).

A gate's rows are keyed by `gate_key` (the source for its own handlers or forward,
`source/destination` for a named destination). Each change reads the rows and the database's
clock under the rows' locks, asks `core.flow` what follows, and writes it back in the same
transaction: one process at a time per gate, so one probe at a time and no token twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core import flow
from service.store.errors import translate_errors
from service.store.notifications import NOTIFY


def gate_key(source: str, destination: str | None = None) -> str:
    """A gate's row: source names never hold a `/`."""
    return source if not destination else f"{source}/{destination}"


# Both rows locked for the transaction, with the database's clock; a gate never used has no
# row yet (its bucket is full, its breaker closed) and gets one when it is written.
LOCK_BUCKET = text(
    "SELECT tokens, refilled_at, queued_until FROM inbox_rate_limits WHERE source = :key FOR UPDATE"
)
LOCK_BREAKER = text(
    "SELECT failures, open_until, opened_at, probing_until, reserved, reserved_until, "
    "last_error FROM inbox_breakers WHERE source = :key FOR UPDATE"
)
ENSURE = text(
    """
    WITH b AS (
        INSERT INTO inbox_rate_limits (source, tokens, refilled_at)
        SELECT :key, :burst, clock_timestamp() WHERE :bucket
            ON CONFLICT DO NOTHING
    )
    INSERT INTO inbox_breakers (source) SELECT :key WHERE :breaker ON CONFLICT DO NOTHING
    """
)
NOW = text("SELECT clock_timestamp()")
WRITE_BUCKET = text(
    "UPDATE inbox_rate_limits SET tokens = :tokens, refilled_at = :refilled_at, "
    "queued_until = :queued_until WHERE source = :key"
)
WRITE_BREAKER = text(
    """
    UPDATE inbox_breakers
       SET failures = :failures, open_until = :open_until, opened_at = :opened_at,
           probing_until = :probing_until, reserved = :reserved,
           reserved_until = :reserved_until, last_error = :last_error
     WHERE source = :key
    """
)


@dataclass(frozen=True)
class Locked:
    """A gate's rows as read under their locks, and the database's clock then."""

    bucket: flow.Bucket | None
    breaker: flow.Breaker | None
    now: datetime


async def _lock(conn: AsyncConnection, key: str, gates: flow.Gates) -> Locked:
    has_bucket, has_breaker = gates.per_second is not None, gates.breaker_failures is not None
    await conn.execute(
        ENSURE, {"key": key, "burst": gates.burst, "bucket": has_bucket, "breaker": has_breaker}
    )
    bucket = breaker = None
    if has_bucket:
        row = (await conn.execute(LOCK_BUCKET, {"key": key})).one()
        bucket = flow.Bucket(float(row.tokens), row.refilled_at, row.queued_until)
    if has_breaker:
        row = (await conn.execute(LOCK_BREAKER, {"key": key})).one()
        breaker = flow.Breaker(**row._mapping)
    return Locked(bucket, breaker, (await conn.execute(NOW)).scalar_one())


async def _write(
    conn: AsyncConnection, key: str, bucket: flow.Bucket | None, breaker: flow.Breaker | None
) -> None:
    if bucket is not None:
        await conn.execute(WRITE_BUCKET, {"key": key, **bucket.__dict__})
    if breaker is not None:
        await conn.execute(WRITE_BREAKER, {"key": key, **breaker.__dict__})


async def admit(
    engine: AsyncEngine,
    key: str,
    gates: flow.Gates,
    wanted: int,
    lease_seconds: float,
    *,
    queue: bool = False,
    fresh: int = 0,
    slotted: int = 0,
) -> flow.Admission:
    """What may be claimed of gate `key` now (`core.flow.admit`), its share taken; `queue`:
    the runs not admitted get their slots (deferred runs of a named destination), and the
    `slotted` whose slot has come run on it."""
    async with translate_errors(), engine.begin() as conn:
        locked = await _lock(conn, key, gates)
        admission, bucket, breaker = flow.admit(
            gates,
            locked.bucket,
            locked.breaker,
            locked.now,
            wanted,
            lease_seconds,
            queue=queue,
            fresh=fresh,
            slotted=slotted,
        )
        await _write(conn, key, bucket, breaker)
    return admission


@dataclass(frozen=True)
class Outcomes:
    """What a claim admitted by `admission` came to: the messages it ran (`used`; of them,
    `slotted` on their slot's token, not this admission's), and of its forwards, those that
    failed as the breaker counts failures and those that succeeded."""

    admission: flow.Admission
    used: int
    failed: int = 0
    succeeded: int = 0
    error: str | None = None
    slotted: int = 0


async def settle(
    engine: AsyncEngine, key: str, gates: flow.Gates, outcomes: Outcomes
) -> flow.Change | None:
    """Give back the tokens the claim did not use and count its forwards towards the breaker
    (`core.flow.record`); what changed the breaker, if anything."""
    admission = outcomes.admission
    unused = admission.tokens - (outcomes.used - outcomes.slotted)
    if unused <= 0 and gates.breaker_failures is None:
        return None
    async with translate_errors(), engine.begin() as conn:
        locked = await _lock(conn, key, gates)
        bucket, breaker, change = locked.bucket, locked.breaker, None
        if bucket is not None and unused > 0:
            bucket = flow.give_back(gates, bucket, unused)
        if breaker is not None:
            breaker, change = flow.record(
                gates,
                breaker,
                locked.now,
                failed=outcomes.failed,
                succeeded=outcomes.succeeded,
                error=outcomes.error,
                released=admission.reserved,
                probe=admission.probe,
            )
        await _write(conn, key, bucket, breaker)
    return change


BUCKETS = text("SELECT source AS key, tokens, refilled_at, queued_until FROM inbox_rate_limits")
BREAKERS = text(
    "SELECT source AS key, failures, open_until, opened_at, probing_until, reserved, "
    "reserved_until, last_error FROM inbox_breakers"
)


@dataclass(frozen=True)
class Snapshot:
    """Every gate's stored rows, and the database's clock when they were read."""

    buckets: dict[str, flow.Bucket]
    breakers: dict[str, flow.Breaker]
    now: datetime


async def snapshot(engine: AsyncEngine) -> Snapshot:
    """Every gate's rows as they stand, for the admin API, the console and the metrics to
    derive what `core.flow` derives (`breaker_state`, `tokens_now`) on the same clock."""
    async with translate_errors(), engine.connect() as conn:
        buckets = {
            r.key: flow.Bucket(float(r.tokens), r.refilled_at, r.queued_until)
            for r in await conn.execute(BUCKETS)
        }
        breakers = {
            r.key: flow.Breaker(**{k: v for k, v in r._mapping.items() if k != "key"})
            for r in await conn.execute(BREAKERS)
        }
        now = (await conn.execute(NOW)).scalar_one()
    return Snapshot(buckets, breakers, now)


# Pauses (0011): a paused source's messages are not claimed (`store.due.not_paused`); its
# deliveries are still accepted. The pause is a row, so it holds across restarts and for every
# process on the database; the resume deletes it and wakes the workers.
PAUSE = text(
    """
    INSERT INTO inbox_source_pauses AS p (source, operator, reason, actor)
    VALUES (:source, :operator, :reason, :actor)
        ON CONFLICT (source) DO UPDATE
       SET operator = excluded.operator, reason = excluded.reason, actor = excluded.actor
    RETURNING source, paused_at, operator, reason, actor
    """
)
RESUME = text(
    "DELETE FROM inbox_source_pauses WHERE source = :source "
    "RETURNING source, paused_at, operator, reason, actor"
)
PAUSES = text("SELECT source, paused_at, operator, reason, actor FROM inbox_source_pauses")


async def pause_source(
    engine: AsyncEngine, source: str, operator: str, reason: str, actor: str
) -> dict[str, Any]:
    """Pause `source` (again: the operator and reason are replaced, the time kept)."""
    async with translate_errors(), engine.begin() as conn:
        row = (
            await conn.execute(
                PAUSE, {"source": source, "operator": operator, "reason": reason, "actor": actor}
            )
        ).one()
    return dict(row._mapping)


async def resume_source(engine: AsyncEngine, source: str) -> dict[str, Any] | None:
    """Resume `source`: the pause it had, or None if it was not paused."""
    async with translate_errors(), engine.begin() as conn:
        row = (await conn.execute(RESUME, {"source": source})).one_or_none()
        if row is not None:
            await conn.execute(NOTIFY, {"source": source})
    return None if row is None else dict(row._mapping)


async def pauses(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    """Every paused source's pause, by source."""
    async with translate_errors(), engine.connect() as conn:
        return {r.source: dict(r._mapping) for r in await conn.execute(PAUSES)}
