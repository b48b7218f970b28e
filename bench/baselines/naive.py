"""Baseline B: the straightforward SQLModel receiver (a session per request, select-then-insert).

What a careful first version looks like: correct under races (the unique key turns a lost race
into a duplicate), but one SELECT, one INSERT and one COMMIT per delivery, each on the ORM.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import UniqueConstraint
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel import Field, SQLModel, select
from sqlmodel.ext.asyncio.session import AsyncSession

from service.core.db import async_url

TABLE = "naive_messages"


class NaiveMessage(SQLModel, table=True):
    __tablename__ = TABLE
    __table_args__ = (UniqueConstraint("source", "message_id"),)

    id: int | None = Field(default=None, primary_key=True)
    source: str
    message_id: str
    body: bytes
    received_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


def create_app(database_url: str | None = None) -> FastAPI:
    url = async_url(database_url or os.environ["BENCH_DATABASE_URL"])

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # SQLAlchemy's default pool (5 + 10 overflow): the straightforward setup.
        engine: AsyncEngine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(SQLModel.metadata.create_all)
        app.state.sessions = async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)
        yield
        await engine.dispose()

    app = FastAPI(title="bench baseline B: naive SQLModel", lifespan=lifespan)

    @app.post("/webhooks/{source}")
    async def receive(source: str, request: Request, session: SessionDep) -> JSONResponse:
        """Record the delivery unless its message id is already there, then acknowledge."""
        message_id = request.headers["x-message-id"]
        body = await request.body()
        found = await session.exec(
            select(NaiveMessage).where(
                NaiveMessage.source == source, NaiveMessage.message_id == message_id
            )
        )
        if found.first() is not None:
            return JSONResponse({"status": "duplicate", "message_id": message_id})
        session.add(NaiveMessage(source=source, message_id=message_id, body=body))
        try:
            await session.commit()
        except IntegrityError:  # a concurrent request inserted it first
            await session.rollback()
            return JSONResponse({"status": "duplicate", "message_id": message_id})
        return JSONResponse({"status": "accepted", "message_id": message_id})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    return app
