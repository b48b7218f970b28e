"""Handlers the benchmarks configure (`bench.handlers:NAME`); effects go to `bench_effects`."""

from __future__ import annotations

from sqlalchemy import text

from service import HandlerContext, InboxMessage

# `at` is the handler's own clock (clock_timestamp(), not the transaction's now()): the
# latency bench measures accept-to-effect as `at - received_at`.
EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS bench_effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    inbox_id   bigint      NOT NULL,
    message_id text        NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

INSERT_EFFECT = text("INSERT INTO bench_effects (inbox_id, message_id) VALUES (:id, :message_id)")


async def insert_row(message: InboxMessage, ctx: HandlerContext) -> None:
    """One row per message, in the inbox's transaction."""
    await ctx.session.execute(INSERT_EFFECT, {"id": message.id, "message_id": message.message_id})


class SoakFailure(RuntimeError):
    """The failure bench/soak asks for by message id."""


async def insert_or_fail(message: InboxMessage, ctx: HandlerContext) -> None:
    """Like `insert_row`, but ids containing `-fail-` always raise (after staging the row, which
    the rollback must undo) and ids containing `-flaky-` raise on their first attempt only."""
    await insert_row(message, ctx)
    if "-fail-" in message.message_id:
        raise SoakFailure("bench/soak: this id always fails")
    if "-flaky-" in message.message_id and message.attempt == 1:
        raise SoakFailure("bench/soak: this id fails once")
