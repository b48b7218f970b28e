"""Hostile input over HTTP: signed but hostile bodies get a clear 4xx; nothing unauthenticated
is ever recorded, nor answered 5xx."""

from __future__ import annotations

import json

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import AppFactory
from tests.hostile import (
    SECRET,
    SIGNATURE_IN_BODY,
    SIGNED_SOURCES,
    bodies,
    header_names,
    header_values,
    sign_generic,
)


def _signed(body: bytes, msg_id: str = "hostile") -> dict[str, str]:
    headers = sign_generic(body, msg_id)
    headers["content-type"] = "application/json"
    return headers


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"id": "a\xff"}', "not valid UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"id": "a", "id": "b"}', "duplicate key"),
        (json.dumps({"id": "x" * 513}).encode(), "longer than 512"),
        (json.dumps({"id": "a\nb"}).encode(), "non-printable character U+000A"),
        (json.dumps({"id": ["a"]}).encode(), "must be a string"),
        (json.dumps({"id": True}).encode(), "must be a string"),
        (b"", "not valid JSON"),
    ],
)
async def test_hostile_signed_bodies_get_a_clear_4xx(
    client_for: AppFactory, db: asyncpg.Connection, body: bytes, detail: str
) -> None:
    config = {
        "sources": {
            "g": {
                "kind": "generic",
                "secrets": [SECRET],
                "id_json_pointer": "/id",
                "hmac": {"header": "x-sig", "prefix": "sha256="},
            }
        }
    }
    async with client_for(config) as client:
        response = await client.post("/webhooks/g", content=body, headers=_signed(body))
    assert response.status_code == 400, response.text
    assert detail in response.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(sorted(SIGNED_SOURCES)),
    headers=st.dictionaries(header_names, header_values, max_size=6),
    body=bodies,
    query=st.dictionaries(st.sampled_from(["token", "x"]), st.text(max_size=20), max_size=2),
)
async def test_ingest_never_answers_5xx_nor_records_unauthenticated_input(
    client_for: AppFactory,
    db: asyncpg.Connection,
    path: str,
    headers: dict[str, str],
    body: bytes,
    query: dict[str, str],
) -> None:
    async with client_for({"sources": SIGNED_SOURCES}) as client:
        response = await client.post(
            f"/webhooks/{path}", content=body, headers=headers, params=query
        )
    expected = {400, 401, 415} if path in SIGNATURE_IN_BODY else {401}
    assert response.status_code in expected, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0
