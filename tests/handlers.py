"""Handlers the processing tests configure by `tests.handlers:NAME`; effects go to `effects`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, func, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlmodel import Field, SQLModel

from service import HandlerContext, InboxMessage, PermanentFailure, RetryLater

EFFECTS_DDL = """
CREATE TABLE effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    inbox_id   bigint NOT NULL,
    source     text   NOT NULL,
    message_id text   NOT NULL,
    attempt    integer NOT NULL,
    payload    jsonb
)
"""

INSERT_EFFECT = text(
    "INSERT INTO effects (inbox_id, source, message_id, attempt, payload) "
    "VALUES (:inbox_id, :source, :message_id, :attempt, CAST(:payload AS jsonb))"
)

# Switches and signals the tests flip; the handlers run in the test's own event loop.
state: dict[str, Any] = {"sync_fail": False, "slow_seconds": 1.0}
slow_started: asyncio.Event | None = None


RECORD_SETTINGS = text(
    """
    INSERT INTO effects (inbox_id, source, message_id, attempt, payload)
    SELECT :inbox_id, :source, :message_id, :attempt,
           jsonb_build_object('enable_sort', current_setting('enable_sort'),
                              'enable_seqscan', current_setting('enable_seqscan'),
                              'enable_hashjoin', current_setting('enable_hashjoin'),
                              'enable_mergejoin', current_setting('enable_mergejoin'),
                              'plan_cache_mode', current_setting('plan_cache_mode'),
                              'statement_timeout', current_setting('statement_timeout'))
    """
)


async def record_settings(message: InboxMessage, ctx: HandlerContext) -> None:
    """An effect holding the planner and timeout settings the handler's statements run with."""
    await ctx.session.execute(RECORD_SETTINGS, effect_fields(message))


async def record_settings_fail_on_bad(message: InboxMessage, ctx: HandlerContext) -> None:
    """`record_settings`, but a message whose id starts with `bad` fails: its batch runs
    again, isolated, after locking its rows again by id."""
    if message.message_id.startswith("bad"):
        raise RuntimeError("bad message")
    await record_settings(message, ctx)


RECORD_TRANSACTION = text(
    """
    INSERT INTO effects (inbox_id, source, message_id, attempt, payload)
    SELECT :inbox_id, :source, :message_id, :attempt,
           jsonb_build_object('transaction', pg_current_xact_id()::text)
    """
)


async def record_transaction(message: InboxMessage, ctx: HandlerContext) -> None:
    """An effect holding the id of the transaction it commits in: one per batch."""
    await ctx.session.execute(RECORD_TRANSACTION, effect_fields(message))


async def record(message: InboxMessage, ctx: HandlerContext) -> None:
    import json

    payload = None if message.payload is None else json.dumps(message.payload)
    await ctx.session.execute(INSERT_EFFECT, {**effect_fields(message), "payload": payload})


async def fail_twice(message: InboxMessage, ctx: HandlerContext) -> None:
    await record(message, ctx)  # staged, then rolled back with the failure
    if message.attempt < 3:
        raise RuntimeError(f"flaky failure on attempt {message.attempt}")


async def always_fail(message: InboxMessage, ctx: HandlerContext) -> None:
    await record(message, ctx)
    raise ValueError("downstream says no")


async def fail_on_missing_field(message: InboxMessage, ctx: HandlerContext) -> None:
    raise KeyError("customer")


async def permanent(message: InboxMessage, ctx: HandlerContext) -> None:
    await record(message, ctx)
    raise PermanentFailure("this payload can never be handled")


async def retry_once_later(message: InboxMessage, ctx: HandlerContext) -> None:
    if message.attempt == 1:
        raise RetryLater(after_seconds=1.0)
    await record(message, ctx)


async def commits(message: InboxMessage, ctx: HandlerContext) -> None:
    await record(message, ctx)
    await ctx.session.commit()


async def commits_quietly(message: InboxMessage, ctx: HandlerContext) -> None:
    await record(message, ctx)
    # The point: swallowing the refusal must not keep the effects.
    with contextlib.suppress(Exception):
        await ctx.session.commit()


async def sync_switch(message: InboxMessage, ctx: HandlerContext) -> None:
    await record(message, ctx)
    if state["sync_fail"]:
        raise RuntimeError("sync handler failure")


async def slow(message: InboxMessage, ctx: HandlerContext) -> None:
    if slow_started is not None:
        slow_started.set()
    await asyncio.sleep(state["slow_seconds"])
    await record(message, ctx)


async def record_slowly(message: InboxMessage, ctx: HandlerContext) -> None:
    """For worker-process tests: slow enough that batches interleave and a kill lands mid-batch."""
    await asyncio.sleep(0.01)
    await record(message, ctx)


# How many `record_overlapping` calls run at once, and the most that have: a batch runs its
# handlers one after another, so this counts the batches running at once.
overlap: dict[str, float] = {"running": 0, "most": 0, "seconds": 0.005}


async def record_overlapping(message: InboxMessage, ctx: HandlerContext) -> None:
    overlap["running"] += 1
    overlap["most"] = max(overlap["most"], overlap["running"])
    try:
        await asyncio.sleep(overlap["seconds"])
        await record(message, ctx)
    finally:
        overlap["running"] -= 1


async def record_after_gate(message: InboxMessage, ctx: HandlerContext) -> None:
    """Records once the file named by the payload's `until` exists (at most 60 s from now).

    For kill tests: a batch claimed while the gate is shut is certainly still running when the
    test kills its process, however slow the machine.
    """
    gate = Path(message.payload["until"])
    deadline = time.monotonic() + 60
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        await asyncio.sleep(0.02)
    await record(message, ctx)


def not_async(message: InboxMessage, ctx: HandlerContext) -> None:
    """Configured only to check that start-up refuses it."""


async def sql_error_on_bad(message: InboxMessage, ctx: HandlerContext) -> None:
    """A database error inside the handler: only this message's savepoint may be lost."""
    await record(message, ctx)
    if message.message_id.startswith("bad"):
        await ctx.session.execute(text("SELECT * FROM no_such_table"))


# What `unstorable_error_on_bad` puts in its exception's message, by message id: characters
# PostgreSQL's text cannot hold.
UNSTORABLE = {"bad-nul": "field\x00value", "bad-surrogate": "field\udcffvalue"}


async def unstorable_error_on_bad(message: InboxMessage, ctx: HandlerContext) -> None:
    """Records its effect, and fails for the ids of `UNSTORABLE` with that message."""
    await record(message, ctx)
    if message.message_id in UNSTORABLE:
        raise ValueError(UNSTORABLE[message.message_id])


async def count_calls_fail_on_bad(message: InboxMessage, ctx: HandlerContext) -> None:
    """Like `sql_error_on_bad`, and every call is counted in `state["calls"]` (a list of ids)."""
    state.setdefault("calls", []).append(message.message_id)
    await sql_error_on_bad(message, ctx)


async def exit_on_poison(message: InboxMessage, ctx: HandlerContext) -> None:
    """A handler that kills its own process (as a segfault or an OOM kill would) on one id."""
    await record(message, ctx)
    if message.message_id == "poison":
        os._exit(1)


async def block_loop(message: InboxMessage, ctx: HandlerContext) -> None:
    """Blocks the event loop (a blocking client library, a CPU-bound parse) for `sleep` s, or
    less once the file `until` names exists (a test lets go when it has seen what it wanted)."""
    payload = message.payload or {}
    deadline = time.monotonic() + float(payload.get("sleep", 0))
    gate = Path(payload["until"]) if "until" in payload else None
    while time.monotonic() < deadline and not (gate and gate.exists()):
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    await record(message, ctx)


async def stuck_in_database(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stuck inside one statement of its own on the server, for ids starting with "stuck"."""
    await record(message, ctx)
    if message.message_id.startswith("stuck"):
        await ctx.session.execute(text("SELECT pg_sleep(3600)"))


class Effect(SQLModel, table=True):
    """`effects` as a SQLModel table, for handlers that stage rows with `ctx.session.add`."""

    __tablename__ = "effects"

    id: int | None = Field(default=None, primary_key=True)
    inbox_id: int
    source: str | None  # NOT NULL in the table: None makes the flush fail
    message_id: str
    attempt: int


async def add_effect_null_on_bad(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages its row with `add` (flushed later, by the inbox); for ids starting with "bad" the
    row breaks a NOT NULL constraint, so the flush fails, not the handler. Calls are counted in
    `state["calls"]`."""
    state.setdefault("calls", []).append(message.message_id)
    source = None if message.message_id.startswith("bad") else message.source
    ctx.session.add(
        Effect(
            inbox_id=message.id,
            source=source,
            message_id=message.message_id,
            attempt=message.attempt,
        )
    )


async def record_collector(message: InboxMessage, ctx: HandlerContext) -> None:
    """Records the process's collector settings as its effect's payload (`settle_collector`)."""
    import gc
    import json

    settings = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
    await ctx.session.execute(
        INSERT_EFFECT, {**effect_fields(message), "payload": json.dumps(settings)}
    )


def effect_fields(message: InboxMessage) -> dict[str, Any]:
    """The columns of a message's `effects` row but its payload, for the handlers that write
    one."""
    return {
        "inbox_id": message.id,
        "source": message.source,
        "message_id": message.message_id,
        "attempt": message.attempt,
    }


class MappedBase(DeclarativeBase):
    """Plain SQLAlchemy mapped classes, in a registry of their own (not SQLModel's)."""


class MappedEffect(MappedBase):
    """`effects` as a plain SQLAlchemy mapped class (docs/handlers.md: the cheaper row)."""

    __tablename__ = "effects"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    inbox_id: Mapped[int] = mapped_column(BigInteger)
    source: Mapped[str] = mapped_column(Text)
    message_id: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)


async def add_mapped_effect_or_fail(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages a `MappedEffect` row with `add`; for ids starting with "bad", then raises."""
    ctx.session.add(MappedEffect(**effect_fields(message)))
    if message.message_id.startswith("bad"):
        raise RuntimeError("this id always fails, after staging its row")


async def add_then_count(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages a row with `add`, then counts the rows: it must see every row staged before it in
    the batch (`state["seen"]`)."""
    ctx.session.add(Effect(**effect_fields(message)))
    # An ORM statement: the session flushes the rows staged before it first (autoflush).
    count = select(func.count()).select_from(Effect)
    seen = (await ctx.session.execute(count)).scalar_one()
    state.setdefault("seen", []).append(seen)


# `effects` as a plain Core table, for the handlers that stage rows with `ctx.insert`.
EFFECTS = Table(
    "effects",
    MetaData(),
    Column("id", BigInteger, primary_key=True),
    Column("inbox_id", BigInteger),
    Column("source", Text),
    Column("message_id", Text),
    Column("attempt", Integer),
    Column("payload", JSONB),
)


async def insert_effect_or_fail(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages an `effects` row with `ctx.insert`, its payload the parsed body (a JSON column
    given a dict); for ids starting with "bad", then raises."""
    ctx.insert(EFFECTS, {**effect_fields(message), "payload": message.payload})
    if message.message_id.startswith("bad"):
        raise RuntimeError("this id always fails, after staging its row")


async def insert_effect_null_on_bad(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages its row with `ctx.insert` (a SQLModel class as the table); for ids starting with
    "bad" the row breaks a NOT NULL constraint, so the inbox's write fails, not the handler.
    Calls are counted in `state["calls"]`."""
    state.setdefault("calls", []).append(message.message_id)
    fields = effect_fields(message)
    if message.message_id.startswith("bad"):
        fields["source"] = None
    ctx.insert(Effect, fields)


async def insert_into_a_misspelt_column(message: InboxMessage, ctx: HandlerContext) -> None:
    ctx.insert(EFFECTS, {**effect_fields(message), "atempt": message.attempt})


# Handlers of named destinations: each records an effect naming itself, so a test can count
# what each destination applied.


async def _record_as(name: str, message: InboxMessage, ctx: HandlerContext) -> None:
    import json

    await ctx.session.execute(
        INSERT_EFFECT, {**effect_fields(message), "payload": json.dumps({"by": name})}
    )


async def record_billing(message: InboxMessage, ctx: HandlerContext) -> None:
    await _record_as("billing", message, ctx)


async def record_warehouse(message: InboxMessage, ctx: HandlerContext) -> None:
    await _record_as("warehouse", message, ctx)


async def record_billing_slowly(message: InboxMessage, ctx: HandlerContext) -> None:
    """`record_billing`, 10 ms a message: a kill lands inside a batch (as `record_slowly`)."""
    await asyncio.sleep(0.01)
    await _record_as("billing", message, ctx)


async def record_disputes_failing_three_times(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages its effect, then fails on the message's first three attempts."""
    await _record_as("disputes", message, ctx)
    if message.attempt <= 3:
        raise RuntimeError(f"disputes is down (attempt {message.attempt})")


async def record_disputes_unless_down(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages its effect, then fails while `state["disputes_down"]` is set."""
    await _record_as("disputes", message, ctx)
    if state.get("disputes_down"):
        raise RuntimeError("disputes is down")


async def record_span(message: InboxMessage, ctx: HandlerContext) -> None:
    """An effect holding when the handler started and ended (epoch seconds) and the message's
    ordering key, for the ordering tests; 2 ms of work between the two."""
    import json
    import time

    started = time.time()
    await asyncio.sleep(0.002)
    payload = message.payload if isinstance(message.payload, dict) else {}
    span = {"key": payload.get("key"), "start": started, "end": time.time()}
    await ctx.session.execute(
        INSERT_EFFECT, {**effect_fields(message), "payload": json.dumps(span)}
    )


async def record_unless_poison(message: InboxMessage, ctx: HandlerContext) -> None:
    """`record`, but a body with `"poison": true` always fails."""
    if isinstance(message.payload, dict) and message.payload.get("poison"):
        raise RuntimeError("poison message")
    await record(message, ctx)


def fails_first(message_id: str) -> bool:
    """About one message in five, the same ones in every process: those whose id hashes to a
    multiple of five."""
    import zlib

    return zlib.crc32(message_id.encode()) % 5 == 0


async def record_span_failing_first(message: InboxMessage, ctx: HandlerContext) -> None:
    """`record_span` after 10 ms more (as `record_slowly`: a kill lands inside a batch, not
    between two), but the messages `fails_first` picks fail on their first attempt (a transient
    failure: the retry succeeds)."""
    await asyncio.sleep(0.01)
    if message.attempt == 1 and fails_first(message.message_id):
        raise RuntimeError("transient failure on the first attempt")
    await record_span(message, ctx)


async def stage_then_fail_first(message: InboxMessage, ctx: HandlerContext) -> None:
    """Stages an outgoing message to the `crm` endpoint, then fails on the first attempt: the
    outbox tests' handler, whose failed attempt must send nothing."""
    await ctx.outbox.send(
        "crm", {"type": "customer.synced", "id": message.message_id}, event_type="customer.synced"
    )
    if message.attempt == 1:
        raise RuntimeError("failing after staging")


async def stage_to_unknown_endpoint(message: InboxMessage, ctx: HandlerContext) -> None:
    """Names an endpoint the sources file does not have: the attempt fails at the call."""
    await ctx.outbox.send("nowhere", {"id": message.message_id})


async def reserve_stock(message: InboxMessage, ctx: HandlerContext) -> None:
    """Service A of the two-service tests (docs/outbox.md's example): a `PaymentCharged`
    records the payment and stages a `StockReserved` to the `inventory` endpoint (service B),
    in one transaction."""
    payment = message.payload
    ctx.insert(
        EFFECTS,
        {**effect_fields(message), "payload": {"payment": payment["id"]}},
    )
    await ctx.outbox.send(
        "inventory",
        {"type": "StockReserved", "data": {"payment": payment["id"], "sku": payment["sku"]}},
        event_type="StockReserved",
    )


async def decrement_stock(message: InboxMessage, ctx: HandlerContext) -> None:
    """Service B of the two-service tests: a `StockReserved` takes one from its sku's stock
    and records which payment did, in one transaction with the message's processed mark."""
    data = message.payload["data"]
    await ctx.session.execute(
        text("UPDATE stock SET count = count - 1 WHERE sku = :sku"), {"sku": data["sku"]}
    )
    ctx.insert(EFFECTS, {**effect_fields(message), "payload": {"payment": data["payment"]}})


def _issue_fixed(message: InboxMessage) -> bool:
    """The issue tests' fix, deployed by restarting the worker with ISSUES_FIXED set: every
    message but those whose id starts with `again` (a failure after the fix)."""
    return bool(os.environ.get("ISSUES_FIXED")) and not message.message_id.startswith("again")


async def fail_on_value(message: InboxMessage, ctx: HandlerContext) -> None:
    """The issue tests' first handler: a body whose `cause` is `value` raises ValueError;
    the others pass to the next handler."""
    if (message.payload or {}).get("cause") == "value" and not _issue_fixed(message):
        raise ValueError("the amount is not a number")


async def fail_on_key(message: InboxMessage, ctx: HandlerContext) -> None:
    """The issue tests' second handler: a body whose `cause` is `key` raises KeyError; each
    message that gets here is recorded."""
    if (message.payload or {}).get("cause") == "key" and not _issue_fixed(message):
        raise KeyError("customer")
    await record(message, ctx)
