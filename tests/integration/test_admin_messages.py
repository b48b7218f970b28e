"""Admin listing, paging, detail and dead letters over a real database."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

import asyncpg
import httpx

from service.store.admin import glob_like
from tests.admin_seed import AUTH, CONFIG, TOKEN, seed, seed_attempt
from tests.conftest import AppFactory


def admin_client(client_for: AppFactory, config: dict[str, Any] = CONFIG, **settings: Any) -> Any:
    return client_for(config, admin_tokens=[TOKEN], **settings)


async def list_ids(
    client: httpx.AsyncClient, path: str = "/admin/messages", **params: Any
) -> list[int]:
    response = await client.get(path, params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


async def test_listing_is_newest_first_and_every_filter_combines(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    old = await seed(db, "m-old", status="processed", event_type="a.created", age=timedelta(days=2))
    dead = await seed(db, "m-dead", status="dead", event_type="a.created", age=timedelta(hours=5))
    other = await seed(db, "m-other", source="other", status="dead", age=timedelta(hours=3))
    retrying = await seed(
        db, "m-retry", status="retrying", event_type="b.updated", age=timedelta(hours=1)
    )
    new = await seed(db, "m-new", status="pending", event_type="a.created")
    now = datetime.now(UTC)
    async with admin_client(client_for) as client:
        assert await list_ids(client) == [new, retrying, other, dead, old]
        assert await list_ids(client, source="other") == [other]
        assert await list_ids(client, status="dead") == [other, dead]
        assert await list_ids(client, status=["dead", "pending"]) == [new, other, dead]
        assert await list_ids(client, event_type="a.created") == [new, dead, old]
        assert await list_ids(client, message_id="m-retry") == [retrying]
        after = (now - timedelta(hours=4)).isoformat()
        before = (now - timedelta(minutes=30)).isoformat()
        assert await list_ids(client, received_after=after) == [new, retrying, other]
        assert await list_ids(client, received_before=before) == [retrying, other, dead, old]
        assert await list_ids(client, received_after=after, received_before=before) == [
            retrying,
            other,
        ]
        # No offset means UTC.
        naive = (now - timedelta(hours=4)).replace(tzinfo=None).isoformat()
        assert await list_ids(client, received_after=naive) == [new, retrying, other]
        assert await list_ids(
            client, source="hooks", status=["dead", "processed"], event_type="a.created"
        ) == [dead, old]
        assert await list_ids(client, source="nobody") == []
        body = (await client.get("/admin/messages", params={"limit": 2}, headers=AUTH)).json()
    assert [i["id"] for i in body["items"]] == [new, retrying]
    assert body["next_cursor"]
    item = body["items"][1]
    assert item["status"] == "retrying"
    assert item["source"] == "hooks"
    assert item["message_id"] == "m-retry"
    assert item["event_type"] == "b.updated"
    assert item["attempt_count"] == 0
    assert item["receive_count"] == 1


async def test_event_type_filter_is_a_glob_like_the_sources_file(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    created = await seed(db, "m1", event_type="charge.created")
    refunded = await seed(db, "m2", event_type="charge.refunded")
    other = await seed(db, "m3", event_type="chargeXcreated")
    percent = await seed(db, "m4", event_type="100%_off")
    untyped = await seed(db, "m5")
    newest_first = [untyped, percent, other, refunded, created]
    async with admin_client(client_for) as client:
        assert await list_ids(client, event_type="charge.*") == [refunded, created]
        assert await list_ids(client, event_type="charge?created") == [other, created]
        assert await list_ids(client, event_type="charge.refund?d") == [refunded]
        assert await list_ids(client, event_type="*") == newest_first
        # LIKE's own wildcards match only themselves.
        assert await list_ids(client, event_type="%") == []
        assert await list_ids(client, event_type="charge_created") == []
        assert await list_ids(client, event_type="*%_*") == [percent]
        assert await list_ids(client, event_type="100%_off") == [percent]
        assert await list_ids(client, "/admin/dead-letters", event_type="charge.*") == []
        refused = await client.get(
            "/admin/messages", params={"event_type": "charge.[cr]*"}, headers=AUTH
        )
        spec = (await client.get("/openapi.json")).json()
    parameters = spec["paths"]["/admin/messages"]["get"]["parameters"]
    documented = next(p for p in parameters if p["name"] == "event_type")
    assert "glob" in documented["description"]
    assert "charge.*" in documented["description"]
    assert refused.status_code == 422
    assert refused.headers["content-type"] == "application/problem+json"
    assert "character sets" in refused.json()["detail"]


async def test_event_type_glob_matches_in_sql_as_fnmatch_does(db: asyncpg.Connection) -> None:
    """The LIKE pattern agrees with the sources file's fnmatchcase on every pair tried."""
    names = ["", "a", "a.b", "a%b", "a_b", "a\\b", "ab", "%", "_", "\\", "a.b.c", "ba"]
    globs = ["*", "a*", "a?b", "a%b", "a_b", "a\\b", "*\\*", "?", "*.*", "%", "_*", "a*b"]
    for glob in globs:
        like = glob_like(glob)
        for name in names:
            if like is None:
                matched = name == glob
            else:
                matched = await db.fetchval("SELECT $1::text LIKE $2::text", name, like)
            assert matched == fnmatchcase(name, glob), (name, glob, like)


async def test_bad_listing_input_is_a_problem(client_for: AppFactory) -> None:
    bad = [
        {"limit": 0},
        {"limit": 501},
        {"limit": "many"},
        {"status": "lost"},
        {"received_after": "yesterday"},
        {"received_before": "2026-13-01T00:00:00Z"},
        {"received_before": "1700000000"},  # pydantic alone would read it as Unix time
        {"received_after": "-594"},
        {"staus": "dead"},  # a misspelt filter must not silently list everything
    ]
    async with admin_client(client_for) as client:
        for params in bad:
            response = await client.get("/admin/messages", params=params, headers=AUTH)
            assert response.status_code == 422, params
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["status"] == 422
        listed = await client.get(
            "/admin/messages", params={"status": ["dead", "lost"]}, headers=AUTH
        )
        bulk = await client.post("/admin/messages/retry", json={"status": ["lost"]}, headers=AUTH)
        ok = await client.get("/admin/messages", params={"limit": 500}, headers=AUTH)
    assert ok.status_code == 200
    # A list entry is named as in config errors: `[i]`.
    assert listed.json()["detail"].startswith("query.status[1]: ")
    assert bulk.json()["detail"].startswith("body.status[0]: ")


async def test_a_bulk_retry_refuses_a_number_for_a_time_and_retries_nothing(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    dead = await seed(db, "m-dead", status="dead")
    async with admin_client(client_for) as client:
        refused = [
            await client.post("/admin/messages/retry", json=body, headers=AUTH)
            for body in (
                {"received_before": -594},
                {"received_before": 1_700_000_000},
                {"received_after": 1.5},
                {"received_after": True},
                {"received_before": "1700000000"},
            )
        ]
        iso = await client.post(
            "/admin/messages/retry",
            json={"received_before": "2100-01-01T00:00:00Z", "dry_run": True},
            headers=AUTH,
        )
    for response in refused:
        assert response.status_code == 422, response.request.content
        assert response.headers["content-type"] == "application/problem+json"
        assert "ISO 8601" in response.json()["detail"]
    assert await db.fetchval("SELECT status FROM inbox_messages WHERE id = $1", dead) == "dead"
    assert iso.json()["matched"] == 1


async def test_paging_by_7_over_30_with_an_insert_between_pages(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    base = datetime.now(UTC) - timedelta(hours=1)
    expected: list[tuple[datetime, int]] = []
    for i in range(30):
        # Groups of three share a received_at, so the id must break ties for the order to hold.
        at = base + timedelta(seconds=i // 3)
        expected.append((at, await seed(db, f"m-{i}", received_at=at)))
    expected.sort(reverse=True)
    seen: list[int] = []
    cursor: str | None = None
    pages = 0
    async with admin_client(client_for) as client:
        while True:
            params: dict[str, Any] = {"limit": 7}
            if cursor:
                params["cursor"] = cursor
            response = await client.get("/admin/messages", params=params, headers=AUTH)
            assert response.status_code == 200, response.text
            body = response.json()
            seen += [item["id"] for item in body["items"]]
            pages += 1
            if pages == 1:
                await seed(db, "arrived-between-pages")
            cursor = body["next_cursor"]
            if cursor is None:
                break
    assert pages == 5
    assert seen == [row_id for _, row_id in expected]


async def test_tampered_malformed_or_foreign_cursor_is_400(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    for i in range(3):
        await seed(db, f"m-{i}", status="dead")
    async with admin_client(client_for) as client:
        first = await client.get("/admin/messages", params={"limit": 1}, headers=AUTH)
        cursor = first.json()["next_cursor"]
        payload, mac = cursor.split(".")
        flipped = payload[:-1] + ("A" if payload[-1] != "A" else "B")
        for bad in [f"{flipped}.{mac}", "not-a-cursor", f"{payload}.", "!!!.???", cursor + "x"]:
            response = await client.get(
                "/admin/messages", params={"limit": 1, "cursor": bad}, headers=AUTH
            )
            assert response.status_code == 400, bad
            assert response.headers["content-type"] == "application/problem+json"
            assert "cursor" in response.json()["detail"]
        # A cursor belongs to its filters and its listing.
        other_filter = await client.get(
            "/admin/messages", params={"limit": 1, "cursor": cursor, "status": "dead"}, headers=AUTH
        )
        other_listing = await client.get(
            "/admin/dead-letters", params={"limit": 1, "cursor": cursor}, headers=AUTH
        )
        good = await client.get(
            "/admin/messages", params={"limit": 1, "cursor": cursor}, headers=AUTH
        )
    assert other_filter.status_code == 400
    assert other_listing.status_code == 400
    assert good.status_code == 200


async def test_cursor_from_other_admin_tokens_is_refused(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    for i in range(2):
        await seed(db, f"m-{i}")
    async with admin_client(client_for) as client:
        cursor = (await client.get("/admin/messages", params={"limit": 1}, headers=AUTH)).json()[
            "next_cursor"
        ]
    async with client_for(CONFIG, admin_tokens=[TOKEN, "second-token"]) as client:
        response = await client.get(
            "/admin/messages", params={"limit": 1, "cursor": cursor}, headers=AUTH
        )
    assert response.status_code == 400


async def test_message_detail_has_headers_payload_and_history(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    message = await seed(
        db,
        "evt_1",
        status="retrying",
        event_type="order.created",
        attempts=2,
        body=b'{"id": "evt_1", "amount": 3}',
        headers={"content-type": "application/json", "x-signature": "[redacted]"},
        last_error="boom 2",
    )
    await db.execute("UPDATE inbox_messages SET receive_count = 3 WHERE id = $1", message)
    await seed_attempt(db, message, 1, "retrying", error="boom 1", age=timedelta(minutes=2))
    await seed_attempt(db, message, 2, "retrying", error="boom 2", age=timedelta(minutes=1))
    binary = await seed(db, "bin", body=b"\x00\xffraw", content_type="application/octet-stream")
    broken = await seed(db, "broken", body=b"{not json", content_type="application/json")
    async with admin_client(client_for) as client:
        detail = (await client.get(f"/admin/messages/{message}", headers=AUTH)).json()
        raw = (await client.get(f"/admin/messages/{binary}", headers=AUTH)).json()
        unparsable = (await client.get(f"/admin/messages/{broken}", headers=AUTH)).json()
        missing = await client.get("/admin/messages/999999", headers=AUTH)
        not_an_id = await client.get("/admin/messages/abc", headers=AUTH)
    assert detail["payload"] == {"id": "evt_1", "amount": 3}
    assert detail["body_base64"] is None
    assert detail["headers"]["x-signature"] == "[redacted]"
    assert detail["receive_count"] == 3
    assert detail["attempt_count"] == 2
    assert detail["last_error"] == "boom 2"
    assert [(a["attempt"], a["outcome"], a["error"]) for a in detail["attempts"]] == [
        (1, "retrying", "boom 1"),
        (2, "retrying", "boom 2"),
    ]
    first = detail["attempts"][0]
    assert first["started_at"]
    assert first["finished_at"]
    assert first["error_type"] == "RuntimeError"
    assert first["actor"] is None
    assert raw["payload"] is None
    assert raw["body_base64"] == "AP9yYXc="
    assert unparsable["body_base64"] is not None
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert not_an_id.status_code == 422


async def test_dead_letters_lists_only_dead_with_filters_and_paging(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    d1 = await seed(db, "d1", status="dead", age=timedelta(minutes=3), event_type="x")
    await seed(db, "r1", status="retrying", age=timedelta(minutes=2))
    d2 = await seed(db, "d2", source="other", status="dead", age=timedelta(minutes=1))
    d3 = await seed(db, "d3", status="dead", event_type="x")
    await seed(db, "p1", status="processed")
    async with admin_client(client_for) as client:
        assert await list_ids(client, "/admin/dead-letters") == [d3, d2, d1]
        assert await list_ids(client, "/admin/dead-letters", source="hooks") == [d3, d1]
        assert await list_ids(client, "/admin/dead-letters", event_type="x") == [d3, d1]
        first = (await client.get("/admin/dead-letters", params={"limit": 2}, headers=AUTH)).json()
        second = (
            await client.get(
                "/admin/dead-letters",
                params={"limit": 2, "cursor": first["next_cursor"]},
                headers=AUTH,
            )
        ).json()
        status_param = await client.get(
            "/admin/dead-letters", params={"status": "pending"}, headers=AUTH
        )
    assert [i["id"] for i in first["items"]] == [d3, d2]
    assert [i["id"] for i in second["items"]] == [d1]
    assert second["next_cursor"] is None
    assert status_param.status_code == 422


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


# Stored bodies the detail cannot show as a payload: each is answered with its raw bytes.
ODD_JSON_BODIES = {
    "depth 101": nested(101),
    "depth 500": b"[" * 500 + b"]" * 500,
    "depth 1,000": nested(1_000),
    "depth 100,000": b"[" * 100_000 + b"]" * 100_000,
    "NaN": b'{"amount": NaN}',
    "infinity": b'{"amount": 1e999}',
    "unpaired surrogate": b'{"name": "\\ud800"}',
    "4,301-digit integer": b'{"n": ' + b"9" * 4301 + b"}",
    "not UTF-8": b'{"name": "\xff"}',
    "truncated": b'{"name": ',
}


async def test_message_detail_shows_odd_or_deep_json_bodies_as_raw_bytes(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = {name: await seed(db, name, body=body) for name, body in ODD_JSON_BODIES.items()}
    at_limit = await seed(db, "depth 100", body=nested(100))
    async with admin_client(client_for) as client:
        answers = {
            name: await client.get(f"/admin/messages/{row_id}", headers=AUTH)
            for name, row_id in ids.items()
        }
        deepest_shown = await client.get(f"/admin/messages/{at_limit}", headers=AUTH)
    assert {name: r.status_code for name, r in answers.items() if r.status_code != 200} == {}
    for name, response in answers.items():
        detail = response.json()
        assert detail["payload"] is None, name
        assert base64.b64decode(detail["body_base64"]) == ODD_JSON_BODIES[name], name
    assert deepest_shown.status_code == 200
    assert deepest_shown.json()["payload"] == json.loads(nested(100))
    assert deepest_shown.json()["body_base64"] is None
