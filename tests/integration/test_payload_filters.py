"""Payload filters against real PostgreSQL: `contains` agrees with `jsonb @>` on the cases
where JSON containment is subtle, and the worker runs a handler only for the bodies its
filter passes, recording the others as processed with a note."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from service.sources.filters import json_contains
from tests.conftest import AppFactory
from tests.processing_helpers import (
    WORKER_SETTINGS,
    attempts_of,
    config,
    create_effects,
    delivery,
    wait_until,
)

CONTAINMENT: list[tuple[Any, Any]] = [
    ({"a": 1, "b": 2}, {"a": 1}),
    ({"a": 1}, {"a": 1, "b": 2}),
    ({"a": {"b": {"c": [1, 2, 3]}}}, {"a": {"b": {"c": [3, 1]}}}),
    ({"a": [1, 2]}, {"a": 1}),
    (["a", "b"], "a"),
    (["a", "b"], ["b", "b"]),
    ([[1, 2]], [1]),
    ([1, [2, 3]], [[3]]),
    ({"a": 1}, {"a": 1.0}),
    ({"a": 1}, {"a": True}),
    ({"a": "1"}, {"a": 1}),
    ({"a": None}, {"a": None}),
    ({"a": None}, {}),
    ([], []),
    ({}, []),
    ("s", "s"),
    ({"a": [{"b": 1, "c": 2}]}, {"a": [{"c": 2}]}),
    ({"a": [{"b": 1}, {"c": 2}]}, {"a": [{"b": 1, "c": 2}]}),
]


@pytest.mark.parametrize(("document", "wanted"), CONTAINMENT)
async def test_contains_agrees_with_postgresql(
    db: asyncpg.Connection, document: Any, wanted: Any
) -> None:
    expected = await db.fetchval(
        "SELECT $1::jsonb @> $2::jsonb", json.dumps(document), json.dumps(wanted)
    )
    assert json_contains(document, wanted) is expected


async def test_the_worker_runs_a_handler_only_for_the_bodies_its_filter_passes(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    entry = {
        "target": "tests.handlers:record",
        "event_types": ["charge.*"],
        "payload": {"where": [{"pointer": "/data/object/currency", "in": ["eur", "chf"]}]},
    }
    bodies = {
        "eur": {"data": {"object": {"currency": "eur"}}},
        "usd": {"data": {"object": {"currency": "usd"}}},
        "bare": {"data": {}},
    }
    async with client_for(config(handler=[entry]), run_worker=True, **WORKER_SETTINGS) as client:
        for message_id, body in bodies.items():
            sent = await client.post(
                "/webhooks/hooks",
                content=json.dumps(body).encode(),
                headers=delivery(message_id, "charge.succeeded"),
            )
            assert sent.status_code == 200
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 3)
    assert [r["message_id"] for r in await db.fetch("SELECT message_id FROM effects")] == ["eur"]
    for message_id in ("usd", "bare"):
        (note,) = await attempts_of(db, message_id)
        assert note["outcome"] == "skipped"
        assert note["error"] == (
            "no handler matches event type 'charge.succeeded' and its payload; "
            "processed without effect"
        )
