"""Handlers the benchmarks configure (`bench.handlers:NAME`); effects go to `bench_effects`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlmodel import Field, SQLModel

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
    """One row per message, in the inbox's transaction: a statement (a round trip) each."""
    await ctx.session.execute(INSERT_EFFECT, {"id": message.id, "message_id": message.message_id})


class BenchEffect(SQLModel, table=True):
    """`bench_effects` as a SQLModel table, for the `add_row` handler."""

    __tablename__ = "bench_effects"

    id: int | None = Field(default=None, primary_key=True)
    inbox_id: int
    message_id: str
    at: datetime | None = Field(
        default=None, sa_column_kwargs={"server_default": text("clock_timestamp()")}
    )


async def add_row(message: InboxMessage, ctx: HandlerContext) -> None:
    """One row per message, staged the SQLModel way: the worker flushes a batch's rows at once
    (one multi-row INSERT), so this costs no round trip of its own."""
    ctx.session.add(BenchEffect(inbox_id=message.id, message_id=message.message_id))


class MappedBase(DeclarativeBase):
    """A registry of plain SQLAlchemy mapped classes, apart from SQLModel's."""


class MappedEffect(MappedBase):
    """`bench_effects` as a plain SQLAlchemy mapped class, for the `add_mapped_row` handler:
    no pydantic validation when a row is built."""

    __tablename__ = "bench_effects"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    inbox_id: Mapped[int] = mapped_column(BigInteger)
    message_id: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), server_default=text("clock_timestamp()")
    )


async def add_mapped_row(message: InboxMessage, ctx: HandlerContext) -> None:
    """As `add_row`, with a plain SQLAlchemy mapped class instead of a SQLModel table."""
    ctx.session.add(MappedEffect(inbox_id=message.id, message_id=message.message_id))


async def insert_staged_row(message: InboxMessage, ctx: HandlerContext) -> None:
    """One row per message, staged with `ctx.insert`: no model is built, and the worker writes
    a batch's rows in one COPY. `at` is the database's default when that COPY runs."""
    ctx.insert(MappedEffect, {"inbox_id": message.id, "message_id": message.message_id})


async def nothing(message: InboxMessage, ctx: HandlerContext) -> None:
    """No effect: the control drain, which measures what the worker itself costs per message
    (claim, run, record), so that the effect styles above show what their own row costs."""


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


# bench/outbox's two services: A's handler stages a `StockReserved` for B, B's takes one from
# the stock. `at` in B's table is the effect's own clock (clock_timestamp()), which the bench
# compares with the sender's wall clock when A answered (both on this machine).
STOCK_DDL = """
CREATE TABLE IF NOT EXISTS bench_stock (sku text PRIMARY KEY, count integer NOT NULL);
CREATE TABLE IF NOT EXISTS bench_stock_effects (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment text        NOT NULL,
    sku     text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# One round trip: the stock's row and the effect's.
TAKE_STOCK = text(
    """
    WITH taken AS (UPDATE bench_stock SET count = count - 1 WHERE sku = :sku)
    INSERT INTO bench_stock_effects (payment, sku) VALUES (:payment, :sku)
    """
)


async def reserve_stock(message: InboxMessage, ctx: HandlerContext) -> None:
    """Service A: a payment stages one `StockReserved` to the `inventory` endpoint (B), in the
    handler's transaction, under the key derived from the payment's message."""
    payment = message.payload
    await ctx.outbox.send(
        "inventory",
        {"type": "StockReserved", "data": {"payment": payment["id"], "sku": payment["sku"]}},
        event_type="StockReserved",
    )


async def decrement_stock(message: InboxMessage, ctx: HandlerContext) -> None:
    """Service B: a `StockReserved` takes one from its sku's stock and records which payment
    did, with the message's processed mark."""
    data = message.payload["data"]
    await ctx.session.execute(TAKE_STOCK, {"sku": data["sku"], "payment": data["payment"]})
