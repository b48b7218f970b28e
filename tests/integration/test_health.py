"""Liveness, readiness and the OpenAPI document."""

from __future__ import annotations

from tests.conftest import AppFactory


async def test_healthz_and_readyz(client_for: AppFactory) -> None:
    async with client_for({}) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


async def test_readyz_is_503_when_schema_is_behind(client_for: AppFactory, db) -> None:  # type: ignore[no-untyped-def]
    await db.execute("UPDATE alembic_version SET version_num = 'older'")
    async with client_for({}) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert "migrate" in ready.json()["detail"]


async def test_openapi_documents_ingest(client_for: AppFactory) -> None:
    async with client_for({}) as client:
        spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"]["/webhooks/{source}"]["post"]
    assert operation["summary"] == "Receive a delivery"
    assert {"200", "401", "404", "413", "503"} <= set(operation["responses"])
