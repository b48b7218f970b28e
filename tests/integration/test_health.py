"""Liveness, readiness and the OpenAPI document."""

from __future__ import annotations

import asyncpg
import pytest

from service.core.migrations import head_revision
from tests.conftest import AppFactory


async def test_healthz_and_readyz(client_for: AppFactory) -> None:
    async with client_for({}) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert ready.json()["warnings"] == []


async def test_readyz_names_a_generic_source_that_accepts_unsigned_deliveries(
    client_for: AppFactory,
) -> None:
    generic = {"kind": "generic", "id_header": "x-id"}
    sources = {
        "open": generic,
        "signed": {**generic, "secrets": ["s3cr3t-value"], "hmac": {"header": "x-sig"}},
        "tokened": {**generic, "token": "t0ken-value"},
        "basic": {**generic, "basic_auth": "user:pa55word"},
    }
    async with client_for({"sources": sources}) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 200  # it starts, as it always has
    assert ready.json()["warnings"] == [
        "source open accepts unsigned deliveries: it has no [hmac], basic_auth or token"
    ]


@pytest.mark.parametrize(
    ("revision", "detail"),
    [
        ("0004", "schema at 0004, expected {head}: run `webhook-inbox migrate`"),
        (
            "9001_from_the_future",  # a rollback: a newer release migrated the database
            "schema at 9001_from_the_future, newer than this release knows (its newest is "
            "{head}): a newer release migrated the database",
        ),
    ],
)
async def test_readyz_is_503_and_says_why_when_the_schema_is_not_at_head(
    client_for: AppFactory, db: asyncpg.Connection, revision: str, detail: str
) -> None:
    await db.execute("UPDATE alembic_version SET version_num = $1", revision)
    async with client_for({}) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["detail"] == detail.format(head=head_revision())


async def test_openapi_documents_ingest(client_for: AppFactory) -> None:
    async with client_for({}) as client:
        spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"]["/webhooks/{source}"]["post"]
    assert operation["summary"] == "Receive a delivery"
    assert {"200", "401", "404", "413", "503"} <= set(operation["responses"])
