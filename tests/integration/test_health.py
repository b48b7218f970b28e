"""Liveness, readiness and the OpenAPI document."""

from __future__ import annotations

import asyncpg

from service.core.migrations import head_revision
from tests.conftest import AppFactory


async def test_healthz_and_readyz(client_for: AppFactory) -> None:
    async with client_for({}) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


async def test_readyz_is_503_when_schema_is_behind(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await db.execute("UPDATE alembic_version SET version_num = '0004'")
    async with client_for({}) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["detail"] == (
        f"schema at 0004, expected {head_revision()}: run `webhook-inbox migrate`"
    )


async def test_readyz_is_503_and_says_so_when_a_newer_release_migrated(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await db.execute("UPDATE alembic_version SET version_num = '9001_from_the_future'")
    async with client_for({}) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["detail"] == (
        "schema at 9001_from_the_future, newer than this release knows (its newest is "
        f"{head_revision()}): a newer release migrated the database"
    )


async def test_openapi_documents_ingest(client_for: AppFactory) -> None:
    async with client_for({}) as client:
        spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"]["/webhooks/{source}"]["post"]
    assert operation["summary"] == "Receive a delivery"
    assert {"200", "401", "404", "413", "503"} <= set(operation["responses"])
