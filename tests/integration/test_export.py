"""Exporting a search as JSON lines (issue 67): the listing's matches with their bodies and
redacted headers, newest first, in flat keyset pages; a refused search is a problem before
anything streams; the command line writes the same lines."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from service.store import admin as store
from service.store import search
from tests.admin_seed import AUTH
from tests.cli_runner import cli
from tests.conftest import AppFactory
from tests.console_helpers import sign_in
from tests.integration.test_admin_messages import admin_client, list_ids
from tests.integration.test_search import HOSTILE, seeded


async def exported(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    response = await client.get("/admin/messages/export", params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.text == "" or response.text.endswith("\n")
    return [json.loads(line) for line in response.text.splitlines()]


async def test_an_export_is_the_listings_matches_with_their_deliveries(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = await seeded(db)
    searches: list[dict[str, Any]] = [
        {},
        {"q": "cus_9"},
        {"where": "data.object.customer=cus_9", "status": "dead"},
        {"header": "X-Shop-Domain: acme.example"},
        {"id_prefix": "evt", "source": "hooks"},
    ]
    async with admin_client(client_for) as client:
        for params in searches:
            lines = await exported(client, **params)
            assert [line["id"] for line in lines] == await list_ids(client, **params), params
            listed = (await client.get("/admin/messages", params=params, headers=AUTH)).json()
            for line, summary in zip(lines, listed["items"], strict=True):
                # Each line is the listing's summary, with the delivery as the detail has it.
                detail = (await client.get(f"/admin/messages/{line['id']}", headers=AUTH)).json()
                assert {k: line[k] for k in summary} == summary
                delivery = ("content_type", "headers", "payload", "body_base64")
                assert {k: line[k] for k in delivery} == {k: detail[k] for k in delivery}
                assert set(line) == set(summary) | set(delivery)
        capped = await exported(client, limit=2)
        text = await exported(client, q="plain-1")
    assert [line["id"] for line in capped] == [ids["broken"], ids["text"]]
    # A body that is not JSON comes as base64, as the detail decides.
    assert text[0]["payload"] is None
    assert text[0]["body_base64"] == "Y3VzdG9tZXIgY3VzXzkgcGFpZCBjaF8zUUg="
    assert text[0]["content_type"] == "text/plain"


async def test_headers_come_redacted_as_ingest_stored_them(client_for: AppFactory) -> None:
    async with admin_client(client_for) as client:
        accepted = await client.post(
            "/webhooks/hooks",
            json={"order": 7},
            headers={"X-Message-Id": "m-7", "Authorization": "Bearer s3cret", "X-Shop": "acme"},
        )
        assert accepted.status_code in (200, 202), accepted.text
        response = await client.get("/admin/messages/export", headers=AUTH)
    (line,) = [json.loads(text) for text in response.text.splitlines()]
    assert line["headers"]["authorization"] == "[redacted]"
    assert line["headers"]["x-shop"] == "acme"
    assert line["payload"] == {"order": 7}
    assert "s3cret" not in response.text


@pytest.mark.parametrize("params", HOSTILE, ids=lambda p: repr(p)[:40])
async def test_a_hostile_search_is_a_problem_and_nothing_streams(
    client_for: AppFactory, db: asyncpg.Connection, params: dict[str, Any]
) -> None:
    await seeded(db)
    async with admin_client(client_for) as client:
        response = await client.get("/admin/messages/export", params=params, headers=AUTH)
    assert response.status_code in (400, 422), response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["detail"]


async def test_too_many_conditions_in_all_is_a_problem(client_for: AppFactory) -> None:
    """Each list is within its bound; together they are over the search's."""
    params = {"where": ["a=1"] * 15, "header": ["X-A: 1"] * 10}
    async with admin_client(client_for) as client:
        response = await client.get("/admin/messages/export", params=params, headers=AUTH)
    assert response.status_code == 422, response.text
    assert "at most 20 conditions" in response.json()["detail"]


async def test_a_first_page_past_the_time_bound_is_a_problem(
    client_for: AppFactory, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    await db.execute(
        """
        INSERT INTO inbox_messages (source, message_id, body, content_type, searchable)
        SELECT 'hooks', 'bulk-' || g, convert_to('{"n": 1}', 'UTF8'), 'application/json', true
          FROM generate_series(1, 30000) g
        """
    )
    monkeypatch.setattr(search, "SEARCH_TIMEOUT_MS", 1)
    monkeypatch.setattr(store, "FEW_MATCHES_MS", 1)
    async with admin_client(client_for) as client:
        response = await client.get(
            "/admin/messages/export", params={"where": ["n=1", "m!=1"]}, headers=AUTH
        )
    assert response.status_code == 422, response.text
    assert "ran past" in response.json()["detail"]


async def test_thousands_stream_in_order_a_flat_page_at_a_time(
    client_for: AppFactory, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    await db.execute(
        """
        INSERT INTO inbox_messages (source, message_id, body, content_type, received_at,
                                    searchable)
        SELECT 'hooks', 'bulk-' || g, convert_to('{"n": ' || g || '}', 'UTF8'),
               'application/json', now() - g * interval '1 second', true
          FROM generate_series(1, 3000) g
        """
    )
    pages: list[int] = []
    list_messages = store.list_messages

    async def counted(*args: Any, **kwargs: Any) -> Any:
        rows, after = await list_messages(*args, **kwargs)
        pages.append(len(rows))
        return rows, after

    monkeypatch.setattr(store, "list_messages", counted)
    async with admin_client(client_for) as client:
        lines = await exported(client, id_prefix="bulk-")
        capped = await exported(client, limit=260)
    assert [line["payload"]["n"] for line in lines] == list(range(1, 3001))
    assert len({line["id"] for line in lines}) == 3000
    assert pages[:12] == [store.EXPORT_PAGE_SIZE] * 12
    assert [line["payload"]["n"] for line in capped] == list(range(1, 261))
    assert pages[12:] == [250, 10]


async def test_the_command_line_writes_the_same_lines(
    client_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    await seeded(db)
    async with admin_client(client_for) as client:
        response = await client.get("/admin/messages/export", params={"q": "cus_9"}, headers=AUTH)
    output = tmp_path / "cus_9.jsonl"
    written = await cli(
        monkeypatch, database_url, "messages", "export", "-q", "cus_9", "--output", str(output)
    )
    assert written.status == 0, written.err
    assert output.read_text() == response.text
    assert written.out == ""
    assert "2 messages exported" in written.err
    printed = await cli(monkeypatch, database_url, "messages", "export", "--limit", "1")
    assert printed.status == 0, printed.err
    assert [json.loads(line)["message_id"] for line in printed.out.splitlines()] == ["evt_broken"]
    refused = await cli(
        monkeypatch, database_url, "messages", "export", "--where", "data..x=1", "-o", str(output)
    )
    assert refused.status == 2
    assert "where" in refused.err
    assert output.read_text() == response.text  # a refused export leaves FILE as it was


async def test_the_console_searches_keeps_the_search_and_exports_it(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = await seeded(db)
    search_params = [("q", "cus_9"), ("where", "data.object.amount=7"), ("header", "")]
    async with admin_client(client_for) as client:
        unsigned = await client.get("/console/messages/export", params={"q": "cus_9"})
        await sign_in(client)
        listed = await client.get("/console/messages", params=search_params)
        # The blank field is dropped from the URL; the search keeps its values on the page.
        assert listed.status_code == 303
        page = await client.get(listed.headers["location"])
        bad = await client.get("/console/messages", params={"where": "data..x=1"})
        export_url = re.search(r'href="(/console/messages/export\?[^"]*)"', page.text)
        assert export_url is not None
        lines = await client.get(html.unescape(export_url.group(1)))
    assert f'href="/console/messages/{ids["c9b"]}"' in page.text
    assert f'href="/console/messages/{ids["c9"]}"' not in page.text
    assert 'value="cus_9"' in page.text
    assert 'value="data.object.amount=7"' in page.text
    assert bad.status_code == 200
    assert "These filters cannot be used" in bad.text
    assert "where: " in bad.text
    assert lines.status_code == 200
    assert lines.headers["content-type"] == "application/x-ndjson"
    assert [json.loads(line)["id"] for line in lines.text.splitlines()] == [ids["c9b"]]
    assert unsigned.status_code in (303, 401, 403)


async def test_an_export_failing_after_it_started_leaves_no_file_that_looks_whole(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A later page's search cut short (its first page was fine) stops the command with
    status 1 and how far it got; `--output` is not written, nor one there before changed."""
    await db.execute(
        """
        INSERT INTO inbox_messages (source, message_id, body, content_type, searchable)
        SELECT 'hooks', 'bulk-' || g, convert_to('{"n": 1}', 'UTF8'), 'application/json', true
          FROM generate_series(1, 300) g
        """
    )
    list_messages = store.list_messages
    calls = 0

    async def second_page_too_broad(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise search.SearchTooBroad("the search ran past 5 s and was stopped: narrow it")
        return await list_messages(*args, **kwargs)

    monkeypatch.setattr(store, "list_messages", second_page_too_broad)
    output = tmp_path / "all.jsonl"
    output.write_text("an earlier export\n")
    ran = await cli(monkeypatch, database_url, "messages", "export", "--output", str(output))
    assert ran.status == 1, ran.err
    assert "export stopped after 250 messages: the search ran past 5 s" in ran.err
    assert output.read_text() == "an earlier export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.jsonl"]
