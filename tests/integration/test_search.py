"""Search by what a message holds (issue 67): each form finds exactly its matches, combines
with the other filters and paging, and hostile input is a 4xx problem that changes nothing."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from service.store import admin, search
from tests.admin_seed import AUTH, CONFIG, seed
from tests.cli_runner import cli
from tests.conftest import AppFactory
from tests.integration.test_admin_messages import admin_client, list_ids
from tests.integration.test_bulk_actions import act


def charge(customer: str, charge_id: str, amount: int, **extra: Any) -> bytes:
    event = {
        "id": f"evt_{charge_id}",
        "type": "charge.succeeded",
        "data": {
            "object": {
                "id": charge_id,
                "customer": customer,
                "amount": amount,
                "items": [{"sku": "a"}, {"sku": "b"}],
                **extra,
            }
        },
    }
    return json.dumps(event).encode()


async def seeded(db: asyncpg.Connection) -> dict[str, int]:
    """Five messages, oldest first, of two sources, with payloads, headers and statuses to
    tell the forms apart."""
    ids: dict[str, int] = {}
    ids["c9"] = await seed(
        db,
        "evt_1Qa",
        body=charge("cus_9", "ch_3QH", 500, note="50% off_now"),
        headers={"x-shop-domain": "acme.example", "user-agent": "Stripe/1.0"},
        age=timedelta(hours=5),
        status="dead",
    )
    ids["c10"] = await seed(
        db,
        "evt_1Qb",
        body=charge("cus_10", "ch_4AB", 42),
        headers={"x-shop-domain": "other.example"},
        age=timedelta(hours=4),
    )
    ids["c9b"] = await seed(
        db,
        "evt_2Zc",
        body=charge("cus_9", "ch_5CD", 7, **{"x.y": {"z": "dotted"}}),
        headers={"x-shop-domain": "acme.example"},
        age=timedelta(hours=3),
        status="processed",
    )
    ids["text"] = await seed(
        db,
        "plain-1",
        source="other",
        body=b"customer cus_9 paid ch_3QH",
        content_type="text/plain",
        age=timedelta(hours=2),
    )
    ids["broken"] = await seed(db, "evt_broken", body=b'{"data": ', age=timedelta(hours=1))
    return ids


async def test_each_search_form_finds_exactly_its_matches(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = await seeded(db)
    c9, c10, c9b = ids["c9"], ids["c10"], ids["c9b"]
    async with admin_client(client_for) as client:

        async def found(**params: Any) -> list[int]:
            return await list_ids(client, **params)

        # The dedup key's prefix, its LIKE characters taken literally.
        assert await found(id_prefix="evt_1Q") == [c10, c9]
        assert await found(id_prefix="evt") == [ids["broken"], c9b, c10, c9]
        assert await found(id_prefix="evt%") == []
        # Containment, as PostgreSQL's @>: a non-JSON body never matches.
        contains = {"data": {"object": {"customer": "cus_9"}}}
        assert await found(contains=json.dumps(contains)) == [c9b, c9]
        assert await found(contains='{"data": {"object": {"items": [{"sku": "b"}]}}}') == [
            c9b,
            c10,
            c9,
        ]
        # path=value, and the other operators.
        assert await found(where="data.object.customer=cus_9") == [c9b, c9]
        assert await found(where=["data.object.customer!=cus_9", "data.object.items.sku=a"]) == [
            c10
        ]
        assert await found(where="data.object.customer in cus_10, cus_9") == [c9b, c10, c9]
        assert await found(where="data.object.amount=42") == [c10]
        assert await found(where='data.object.amount="42"') == []
        assert await found(where="data.object.items.sku=b") == [c9b, c10, c9]
        assert await found(where="data.object.items[0].sku=b") == []
        cus_9 = "data.object.customer=cus_9"
        assert await found(where=['data.object."x.y".z exists', cus_9]) == [c9b]
        assert await found(where=["data.object.note exists", cus_9]) == [c9]
        assert await found(where="data.object.note exists", q="cus_9") == [c9]
        assert await found(where=["data.object.customer=cus_9", "data.object.amount=7"]) == [c9b]
        # A header's value, the name in any case.
        assert await found(header="X-Shop-Domain: acme.example") == [c9b, c9]
        assert await found(header="x-shop-domain=other.example") == [c10]
        assert await found(header="X-Shop-Domain: acme") == []
        # Free text: a value anywhere in the payload, or the dedup key.
        assert await found(q="ch_3QH") == [c9]
        assert await found(q="cus_9") == [c9b, c9]
        assert await found(q="dotted") == [c9b]
        assert await found(q="plain-1") == [ids["text"]]
        assert await found(q="500") == [c9]
        # Combined with every other filter.
        assert await found(q="cus_9", status="dead") == [c9]
        assert await found(where="data.object.customer=cus_9", source="other") == []
        assert await found(header="X-Shop-Domain: acme.example", event_type="*") == [c9b, c9]


async def test_a_search_pages_by_cursor_and_a_cursor_is_bound_to_it(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = await seeded(db)
    params = {"where": "data.object.items.sku=a", "limit": 1}
    async with admin_client(client_for) as client:
        seen: list[int] = []
        cursor = None
        while True:
            page = await client.get(
                "/admin/messages",
                params={**params, "cursor": cursor} if cursor else params,
                headers=AUTH,
            )
            assert page.status_code == 200, page.text
            seen += [item["id"] for item in page.json()["items"]]
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
        assert seen == [ids["c9b"], ids["c10"], ids["c9"]]
        first = await client.get("/admin/messages", params=params, headers=AUTH)
        other = {"where": "data.object.items.sku=b", "cursor": first.json()["next_cursor"]}
        refused = await client.get("/admin/messages", params=other, headers=AUTH)
    assert refused.status_code == 400


async def test_bulk_retry_by_search_counts_then_retries_only_the_matches(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = await seeded(db)
    await db.execute("UPDATE inbox_messages SET status = 'dead'")
    request = {"where": ["data.object.customer=cus_9"]}
    async with admin_client(client_for) as client:
        counted = await client.post(
            "/admin/messages/retry", json={**request, "dry_run": True}, headers=AUTH
        )
        assert counted.json() == {"matched": 2, "retried": 0}
        assert await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'dead'") == 5
        done = await client.post("/admin/messages/retry", json=request, headers=AUTH)
    assert done.json() == {"matched": 2, "retried": 2}
    pending = await db.fetch("SELECT id FROM inbox_messages WHERE status = 'pending' ORDER BY id")
    assert [r["id"] for r in pending] == [ids["c9"], ids["c9b"]]


# CONFIG with the `hooks` source's payloads indexed for search.
SEARCHED: dict[str, Any] = {
    "sources": {
        **CONFIG["sources"],
        "hooks": {**CONFIG["sources"]["hooks"], "search_payload": True},
    }
}


async def test_only_the_payloads_of_a_source_that_asks_are_searched(
    client_for: AppFactory,
) -> None:
    """`search_payload` opts a source's payloads into the index; another source's messages
    are still found by their dedup key and headers."""
    body = charge("cus_9", "ch_3QH", 500)
    async with admin_client(client_for, SEARCHED) as client:
        for source in ("hooks", "other"):
            accepted = await client.post(
                f"/webhooks/{source}",
                content=body,
                headers={"X-Message-Id": f"{source}-1", "X-Shop": "acme"},
            )
            assert accepted.status_code in (200, 202), accepted.text
        by_payload = await client.get(
            "/admin/messages", params={"where": "data.object.customer=cus_9"}, headers=AUTH
        )
        by_text = await client.get("/admin/messages", params={"q": "ch_3QH"}, headers=AUTH)
        by_key = await client.get("/admin/messages", params={"q": "other-1"}, headers=AUTH)
        by_header = await client.get(
            "/admin/messages", params={"header": "X-Shop: acme"}, headers=AUTH
        )

    def sources(response: httpx.Response) -> list[str]:
        assert response.status_code == 200, response.text
        return [m["source"] for m in response.json()["items"]]

    assert sources(by_payload) == ["hooks"]
    assert sources(by_text) == ["hooks"]
    assert sources(by_key) == ["other"]
    assert sources(by_header) == ["other", "hooks"]


async def test_bodies_search_cannot_read_are_still_accepted(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    """The payload index reads every body of a source with `search_payload`: one that is not
    UTF-8 JSON, nests past the server's stack or is large is indexed as nothing, and its
    delivery is accepted."""
    bodies = {
        "not-utf8": b"\xff\xfe{}",
        "not-json": b"hello",
        "deep": b"[" * 200_000 + b"]" * 200_000,
        "nul": b'{"a": "\\u0000"}',
        "large": json.dumps({"k": "v" * 300_000}).encode(),
    }
    async with admin_client(client_for, SEARCHED) as client:
        for name, body in bodies.items():
            accepted = await client.post(
                "/webhooks/hooks", content=body, headers={"X-Message-Id": name}
            )
            assert accepted.status_code in (200, 202), (name, accepted.text)
        listed = await client.get("/admin/messages", params={"id_prefix": "no"}, headers=AUTH)
        assert [m["message_id"] for m in listed.json()["items"]] == ["not-json", "not-utf8"]
    # Each is stored searchable, and none is read as JSON: not even the large one, which is.
    read = await db.fetch(
        "SELECT message_id, searchable, inbox_payload(body) IS NOT NULL AS json FROM inbox_messages"
    )
    assert {(r["message_id"], r["searchable"], r["json"]) for r in read} == {
        (name, True, False) for name in bodies
    }


HOSTILE: list[dict[str, Any]] = [
    {"where": "a'; DROP TABLE inbox_messages; --=1"},
    {"where": "data..customer=x"},
    {"where": "=x"},
    {"where": "data.object.note exists"},
    {"where": ["data.object.note exists", "data.object.customer!=cus_9"]},
    {"where": "data.customer"},
    {"where": 'data."unclosed=x'},
    {"where": "data.customer in "},
    {"where": "x" * 1001},
    {"where": ["a=1"] * 21},
    {"where": ["a=1"] * 11, "header": ["x-a: 1"] * 10},
    {"where": ".".join(["k"] * 40) + "=1"},
    {"q": "\x00"},
    {"q": "   "},
    {"q": "x" * 60_000},
    {"id_prefix": "a\x00b"},
    {"header": "no separator"},
    {"header": "bad name: x"},
    {"contains": "{not json"},
    {"contains": "[" * 40 + "]" * 40},
    {"contains": '{"a": "\\u0000"}'},
    {"contains": '{"a": "\\ud800"}'},
    {"contains": '{"a": NaN}'},
    {"contains": "x" * 10_001},
]


@pytest.mark.parametrize("params", HOSTILE, ids=lambda p: repr(p)[:40])
async def test_hostile_search_input_is_a_problem_and_changes_nothing(
    client_for: AppFactory, db: asyncpg.Connection, params: dict[str, Any]
) -> None:
    await seeded(db)
    before = await db.fetchval(
        "SELECT md5(string_agg(m::text, '' ORDER BY id)) FROM inbox_messages m"
    )
    async with admin_client(client_for) as client:
        listed = await client.get("/admin/messages", params=params, headers=AUTH)
        retried = await client.post("/admin/messages/retry", json=params, headers=AUTH)
    for response in (listed, retried):
        assert response.status_code in (400, 422), response.text
        assert response.headers["content-type"].startswith("application/problem+json")
    after = await db.fetchval(
        "SELECT md5(string_agg(m::text, '' ORDER BY id)) FROM inbox_messages m"
    )
    assert after == before


async def test_hostile_input_in_a_json_body_is_a_problem(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    """A request body carries what a query string cannot: a lone surrogate, a parsed document."""
    await seeded(db)
    async with admin_client(client_for) as client:
        surrogate = await client.post(
            "/admin/messages/retry",
            content=b'{"q": "\\ud800", "dry_run": true}',
            headers={**AUTH, "content-type": "application/json"},
        )
        nested: Any = "x"
        for _ in range(200):
            nested = {"k": nested}
        deep = await client.post(
            "/admin/messages/retry", json={"contains": nested, "dry_run": True}, headers=AUTH
        )
        as_object = await client.post(
            "/admin/messages/retry",
            json={
                "contains": {"data": {"object": {"customer": "cus_9"}}},
                "dry_run": True,
                "status": ["pending", "dead", "processed"],
                "force": True,
            },
            headers=AUTH,
        )
        megabyte = await client.post(
            "/admin/messages/retry", json={"q": "x" * 1_000_000, "dry_run": True}, headers=AUTH
        )
    assert megabyte.status_code == 422, megabyte.text
    assert surrogate.status_code == 422, surrogate.text
    assert deep.status_code == 422, deep.text
    assert as_object.json() == {"matched": 2, "retried": 0}


async def test_a_search_past_its_time_bound_is_refused_as_too_broad(
    client_for: AppFactory, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search the indexes cannot narrow reads rows until it has a page: it is stopped at
    its statement timeout and answered as too broad, not left running."""
    await db.execute(
        """
        INSERT INTO inbox_messages (source, message_id, body, content_type, searchable)
        SELECT 'hooks', 'bulk-' || g, convert_to('{"n": 1}', 'UTF8'),
               'application/json', true
          FROM generate_series(1, 30000) g
        """
    )
    monkeypatch.setattr(search, "SEARCH_TIMEOUT_MS", 1)
    monkeypatch.setattr(admin, "FEW_MATCHES_MS", 1)
    async with admin_client(client_for) as client:
        broad = await client.get("/admin/messages", params={"where": ["n=1", "m!=1"]}, headers=AUTH)
        counted = await client.post(
            "/admin/messages/retry", json={"where": ["n=1", "m!=1"], "dry_run": True}, headers=AUTH
        )
        action = await client.post(
            "/admin/messages/actions",
            json={
                "action": "discard",
                "status": ["pending"],
                "where": ["n=1", "m!=1"],
                "dry_run": True,
            },
            headers=AUTH,
        )
        started = await client.post(
            "/admin/messages/actions",
            json={"action": "discard", "status": ["pending"], "where": ["n=1", "m!=1"]},
            headers=AUTH,
        )
        plain = await client.get("/admin/messages", params={"limit": 1}, headers=AUTH)
    assert await db.fetchval("SELECT count(*) FROM inbox_bulk_actions") == 0
    for refused in (broad, counted, action, started):
        assert refused.status_code == 422, refused.text
        assert "ran past" in refused.json()["detail"]
    assert plain.status_code == 200


async def test_the_command_line_searches_as_the_api_does(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await seeded(db)

    async def found(*args: str) -> list[int]:
        ran = await cli(monkeypatch, database_url, "messages", "list", *args, "--json")
        assert ran.status == 0, ran.err
        return [item["id"] for item in ran.json()["items"]]

    assert await found("-q", "cus_9") == [ids["c9b"], ids["c9"]]
    assert await found(
        "--where", "data.object.customer=cus_9", "--where", "data.object.amount=7"
    ) == [ids["c9b"]]
    assert await found("--header", "X-Shop-Domain: other.example") == [ids["c10"]]
    assert await found("--id-prefix", "evt_1Q", "--status", "dead") == [ids["c9"]]
    assert await found("--contains", '{"data": {"object": {"amount": 42}}}') == [ids["c10"]]
    bad = await cli(monkeypatch, database_url, "messages", "list", "--where", "data..x=1")
    assert bad.status == 2, bad.out
    assert "where" in bad.err
    dead = await cli(monkeypatch, database_url, "dead-letters", "-q", "ch_3QH", "--json")
    assert [item["id"] for item in dead.json()["items"]] == [ids["c9"]]


async def test_an_action_by_search_acts_on_exactly_the_matches_and_records_the_search(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = await seeded(db)
    await db.execute("UPDATE inbox_messages SET status = 'dead'")
    search_fields = {
        "where": ["data.object.customer=cus_9"],
        "header": ["X-Shop-Domain: acme.example"],
    }
    async with admin_client(client_for) as client:
        counted = await client.post(
            "/admin/messages/actions",
            json={"action": "discard", **search_fields, "dry_run": True},
            headers=AUTH,
        )
        assert counted.json()["matched"] == 2
        action = await act(client, action="discard", **search_fields)
        audit = (await client.get("/admin/messages/actions", headers=AUTH)).json()
    assert (action["matched"], action["done"]) == (2, 2)
    discarded = await db.fetch(
        "SELECT id FROM inbox_messages WHERE status = 'discarded' ORDER BY id"
    )
    assert [r["id"] for r in discarded] == [ids["c9"], ids["c9b"]]
    recorded = audit["items"][0]
    assert recorded["query"]["where"] == search_fields["where"]
    assert recorded["query"]["header"] == search_fields["header"]


async def test_a_search_matching_many_pages_newest_first_as_one_matching_few(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    """Past FEW_MATCHES matches a page is found by walking newest first, not from the index's
    matches: both give the same pages."""
    await db.execute(
        """
        INSERT INTO inbox_messages (source, message_id, body, content_type, received_at,
                                    searchable)
        SELECT 'hooks', 'many-' || g, convert_to('{"n": ' || (g % 2) || '}', 'UTF8'),
               'application/json', now() - g * interval '1 second', true
          FROM generate_series(1, $1::int) g
        """,
        4 * admin.FEW_MATCHES,
    )
    newest = await db.fetch(
        "SELECT id FROM inbox_messages WHERE message_id LIKE 'many-%' "
        "AND convert_from(body, 'UTF8') = '{\"n\": 1}' ORDER BY received_at DESC, id DESC LIMIT 150"
    )
    async with admin_client(client_for) as client:
        first = await client.get(
            "/admin/messages", params={"where": "n=1", "limit": 100}, headers=AUTH
        )
        after = {"where": "n=1", "limit": 50, "cursor": first.json()["next_cursor"]}
        second = await client.get("/admin/messages", params=after, headers=AUTH)
    listed = [m["id"] for m in first.json()["items"] + second.json()["items"]]
    assert listed == [r["id"] for r in newest]
