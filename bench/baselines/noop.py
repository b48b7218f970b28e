"""Baseline A: a FastAPI endpoint that reads the body and answers fixed JSON; no database."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def create_app() -> FastAPI:
    app = FastAPI(title="bench baseline A: no database")

    @app.post("/webhooks/{source}")
    async def receive(source: str, request: Request) -> JSONResponse:
        """Read the delivery and acknowledge it without recording anything."""
        await request.body()
        return JSONResponse({"status": "accepted"})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    return app
