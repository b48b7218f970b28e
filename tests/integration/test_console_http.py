"""The console over HTTP (the ASGI app on a real database): sessions, CSRF, headers, escaping,
and that its actions and numbers are the admin API's."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta
from http.cookies import SimpleCookie
from importlib.resources import files
from urllib.parse import parse_qs, urlencode, urlsplit

import asyncpg
import httpx
import pytest
from markupsafe import escape

from service.api.console.assets import asset_url
from service.api.console.session import (
    COOKIE,
    Session,
    decode_session,
    encode_session,
    new_session,
    session_key,
)
from service.api.security import token_fingerprint
from tests.admin_seed import AUTH, CONFIG, TOKEN, seed, seed_attempt, status_of
from tests.conftest import AppFactory
from tests.console_helpers import csrf_of, page_parts, sign_in

CONSOLE_ACTOR = "console:" + token_fingerprint(TOKEN)

PAGES = [
    "/console/",
    "/console/messages",
    "/console/messages?status=dead&source=hooks",
    "/console/messages/{id}",
    "/console/messages/{id}/replay",
    "/console/dead-letters",
    "/console/bulk-retry?status=dead",
    "/console/rejected",
    "/console/outbox",
    "/console/issues",
    "/console/issues/0123456789abcdef",
    "/console/issues/0123456789abcdef/retry",
]
FRAGMENTS = ["/console/overview/live", "/console/messages/{id}/live"]
ACTIONS = [
    "/console/messages/{id}/retry",
    "/console/messages/{id}/replay",
    "/console/messages/{id}/discard",
    "/console/bulk-retry",
    "/console/issues/0123456789abcdef/acknowledge",
    "/console/issues/0123456789abcdef/retry",
]


def console(client_for: AppFactory) -> object:
    return client_for(CONFIG, admin_tokens=[TOKEN])


def set_cookie_header(response: httpx.Response) -> SimpleCookie:
    cookie: SimpleCookie = SimpleCookie()
    cookie.load(response.headers["set-cookie"])
    return cookie


@pytest.mark.parametrize("cookie", [None, "tampered", "expired", "anonymous"])
async def test_no_page_or_action_without_a_signed_in_session(
    client_for: AppFactory, db: asyncpg.Connection, cookie: str | None
) -> None:
    dead = await seed(db, "m-1", status="dead")
    key = session_key([TOKEN])
    signed = encode_session(key, new_session(token_fingerprint(TOKEN), time.time()))
    cookies = {
        None: None,
        "tampered": signed[:-2] + ("AA" if not signed.endswith("AA") else "BB"),
        "expired": encode_session(
            key, Session("n", token_fingerprint(TOKEN), int(time.time()) - 1)
        ),
        "anonymous": encode_session(key, new_session(None, time.time())),
    }[cookie]
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        if cookies is not None:
            client.cookies.set(COOKIE, cookies, path="/console")
        for path in PAGES:
            response = await client.get(path.format(id=dead))
            assert response.status_code == 303, path
            location = urlsplit(response.headers["location"])
            assert location.path == "/console/sign-in"
            assert parse_qs(location.query)["next"] == [path.format(id=dead)]
        for path in FRAGMENTS:
            assert (await client.get(path.format(id=dead))).status_code == 401, path
        for path in ACTIONS:
            response = await client.post(path.format(id=dead), data={"csrf_token": "x"})
            assert response.status_code == 403, path
            assert "Sign in" in response.text
    assert await status_of(db, dead) == "dead"
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0


async def test_a_post_without_the_sessions_csrf_token_is_refused(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    dead = await seed(db, "m-1", status="dead")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        other_session = csrf_of((await client.get("/console/")).text)
        assert other_session == csrf  # one token per session
        async with client_for(CONFIG, admin_tokens=[TOKEN]) as other:
            foreign = await sign_in(other)
        assert foreign != csrf
        refused = [
            await client.post(f"/console/messages/{dead}/{action}", data=form)
            for action in ("retry", "discard")
            for form in ({}, {"csrf_token": ""}, {"csrf_token": foreign}, {"token": csrf})
        ]
        refused.append(await client.post("/console/bulk-retry", data={"status": "dead"}))
        refused.append(await client.post("/console/sign-out", data={}))
        assert [r.status_code for r in refused] == [403] * len(refused)
        assert await status_of(db, dead) == "dead"
        assert (await client.get("/console/")).status_code == 200  # still signed in
        accepted = await client.post(f"/console/messages/{dead}/retry", data={"csrf_token": csrf})
    assert accepted.status_code == 303
    assert await status_of(db, dead) == "pending"


async def test_the_sign_in_form_itself_needs_its_csrf_token(client_for: AppFactory) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        without = await client.post("/console/sign-in", data={"token": TOKEN})
        after = await client.get("/console/")
    assert without.status_code == 403
    assert "expired" in without.text
    assert after.status_code == 303


async def test_a_wrong_token_is_refused_and_starts_no_session(client_for: AppFactory) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        form = await client.get("/console/sign-in")
        wrong = await client.post(
            "/console/sign-in", data={"csrf_token": csrf_of(form.text), "token": TOKEN + "x"}
        )
        after = await client.get("/console/")
    assert wrong.status_code == 401
    assert "not an admin token" in wrong.text
    assert TOKEN not in wrong.text
    assert after.status_code == 303


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_the_session_cookie_is_httponly_strict_scoped_expiring_and_secure_over_https(
    client_for: AppFactory, scheme: str
) -> None:
    base = f"{scheme}://inbox.test"
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        form = await client.get(f"{base}/console/sign-in")
        signed_in = await client.post(
            f"{base}/console/sign-in", data={"csrf_token": csrf_of(form.text), "token": TOKEN}
        )
    for response, lifetime in ((form, 3600), (signed_in, 8 * 3600)):
        morsel = set_cookie_header(response)[COOKIE]
        assert morsel["httponly"] is True
        assert morsel["samesite"] == "strict"
        assert morsel["path"] == "/console"
        assert lifetime - 5 <= int(morsel["max-age"]) <= lifetime
        assert bool(morsel["secure"]) is (scheme == "https")
        assert TOKEN not in morsel.value
    session = decode_session(session_key([TOKEN]), set_cookie_header(signed_in)[COOKIE].value, 0)
    assert session is not None
    assert session.actor == token_fingerprint(TOKEN)
    assert time.time() + 8 * 3600 - 5 <= session.expires_at <= time.time() + 8 * 3600


async def test_sign_out_ends_the_session(client_for: AppFactory) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        out = await client.post("/console/sign-out", data={"csrf_token": csrf})
        after = await client.get("/console/")
        signed_out_form = await client.get(out.headers["location"])
    assert out.status_code == 303
    morsel = set_cookie_header(out)[COOKIE]
    assert morsel["max-age"] == "0"
    assert morsel.value in ("", '""')
    assert after.status_code == 303
    assert "You have signed out." in signed_out_form.text


async def test_a_session_ends_when_the_admin_tokens_change(client_for: AppFactory) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        cookie = client.cookies[COOKIE]
    async with client_for(CONFIG, admin_tokens=["a-rotated-admin-token-0123456789"]) as client:
        client.cookies.set(COOKIE, cookie, path="/console")
        assert (await client.get("/console/")).status_code == 303


@pytest.mark.parametrize(
    ("target", "landing"),
    [
        ("/console/messages?status=dead", "/console/messages?status=dead"),
        ("//evil.example/console/", "/console/"),
        ("https://evil.example/", "/console/"),
        ("/console/\\evil", "/console/"),
        ("/admin/stats", "/console/"),
    ],
)
async def test_sign_in_returns_only_to_a_console_page(
    client_for: AppFactory, target: str, landing: str
) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        form = await client.get("/console/sign-in", params={"next": target})
        response = await client.post(
            "/console/sign-in",
            data={"csrf_token": csrf_of(form.text), "token": TOKEN, "next": target},
        )
    assert response.headers["location"] == landing


async def test_every_console_response_has_a_csp_without_inline_script(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    message = await seed(db, "m-1", status="processed")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        responses = [await client.get("/console/sign-in"), await client.get("/console/")]
        await sign_in(client)
        for path in PAGES + FRAGMENTS:
            responses.append(await client.get(path.format(id=message)))
        responses.append(await client.get(asset_url("console.js")))
        responses.append(await client.get("/console/messages/999999"))
    for response in responses:
        policy = response.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["script-src"] == "'self'"
        assert directives["style-src"] == "'self'"
        assert directives["default-src"] == "'none'"
        assert directives["frame-ancestors"] == "'none'"
        assert "unsafe-inline" not in policy
        assert "unsafe-eval" not in policy
        assert response.headers["x-content-type-options"] == "nosniff"
        if response.headers.get("content-type", "").startswith("text/html"):
            assert response.headers["cache-control"] == "no-store"
            parts = page_parts(response.text)
            assert all(s.get("src", "").startswith("/console/static/") for s in parts.scripts)
            assert parts.handlers == []
            assert parts.inline_styles == 0
            assert parts.script_links == []


HOSTILE = '<script>alert("x")</script>"><img src=x onerror=alert(1)>'


async def test_every_message_field_renders_as_text(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    json_body = ('{"note": "' + HOSTILE.replace('"', '\\"') + '"}').encode()
    ids = [
        await seed(
            db,
            HOSTILE,
            status="dead",
            event_type=HOSTILE,
            body=json_body,
            headers={"x-note": HOSTILE, HOSTILE: "value"},
            last_error=HOSTILE,
        ),
        await seed(
            db,
            "plain-" + HOSTILE,
            status="dead",
            body=HOSTILE.encode(),
            content_type="text/html",
        ),
    ]
    await db.execute(
        "INSERT INTO inbox_attempts (message_id, attempt, started_at, outcome, error_type, "
        "error, traceback, actor) VALUES ($1, 1, now(), 'dead', $2, $2, $2, $2)",
        ids[0],
        HOSTILE,
    )
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        pages = [
            await client.get(path)
            for path in (
                f"/console/messages/{ids[0]}",
                f"/console/messages/{ids[1]}",
                f"/console/messages/{ids[0]}/live",
                "/console/messages",
                "/console/dead-letters",
                "/console/",
            )
        ]
        pages.append(await client.get("/console/messages", params={"event_type": HOSTILE}))
        pages.append(await client.get("/console/bulk-retry", params={"error_type": HOSTILE}))
    for response in pages:
        assert response.status_code == 200, response.url
        assert "<script>alert" not in response.text
        assert "<img src=x" not in response.text
        parts = page_parts(response.text)
        assert "img" not in parts.elements
        assert parts.handlers == []
    detail = pages[0].text
    assert escape(HOSTILE) in detail  # the message id, event type, header, error, traceback
    assert escape(HOSTILE.replace('"', '\\"')) in detail  # inside the indented JSON body
    assert escape(HOSTILE) in pages[1].text  # a text body, as it came
    assert escape(HOSTILE) in pages[4].text  # the dead letters' error type group


async def test_console_actions_are_the_apis_recorded_with_a_console_actor(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    dead = await seed(db, "m-dead", status="dead", attempts=3)
    processed = await seed(db, "m-processed", status="processed", attempts=1)
    retrying = await seed(db, "m-retrying", status="retrying", attempts=1)
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        retried = await client.post(f"/console/messages/{dead}/retry", data={"csrf_token": csrf})
        confirm = await client.get(f"/console/messages/{processed}/replay")
        replayed = await client.post(
            f"/console/messages/{processed}/replay", data={"csrf_token": csrf}
        )
        discarded = await client.post(
            f"/console/messages/{retrying}/discard", data={"csrf_token": csrf}
        )
        refused = await client.post(
            f"/console/messages/{retrying}/replay", data={"csrf_token": csrf}
        )
        shown = await client.get(retried.headers["location"])
        api = await client.get(f"/admin/messages/{dead}", headers=AUTH)
    assert retried.headers["location"] == f"/console/messages/{dead}?done=admin_retry"
    assert "the handlers run again" in confirm.text.lower()
    assert replayed.headers["location"] == f"/console/messages/{processed}?done=admin_replay"
    assert discarded.headers["location"] == f"/console/messages/{retrying}?done=admin_discard"
    assert refused.status_code == 409  # only a processed message is replayed
    assert "Retried" in shown.text
    assert CONSOLE_ACTOR in shown.text
    assert [await status_of(db, m) for m in (dead, processed, retrying)] == [
        "pending",
        "pending",
        "discarded",
    ]
    actions = await db.fetch("SELECT outcome, actor FROM inbox_attempts ORDER BY id")
    assert [(a["outcome"], a["actor"]) for a in actions] == [
        ("admin_retry", CONSOLE_ACTOR),
        ("admin_replay", CONSOLE_ACTOR),
        ("admin_discard", CONSOLE_ACTOR),
    ]
    assert api.json()["attempts"][0]["actor"] == CONSOLE_ACTOR


async def test_the_admin_api_keeps_its_bearer_tokens_and_ignores_the_console_cookie(
    client_for: AppFactory,
) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        cookie = client.cookies[COOKIE]
        with_cookie = await client.get("/admin/stats", headers={"Cookie": f"{COOKIE}={cookie}"})
        with_bearer = await client.get("/admin/stats", headers=AUTH)
    assert with_cookie.status_code == 401
    assert with_bearer.status_code == 200


async def test_bulk_retry_counts_first_then_retries_the_same_filter(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    matching = [await seed(db, f"d-{i}", status="dead", event_type="order.paid") for i in range(3)]
    other = await seed(db, "d-other", status="dead", event_type="order.created")
    processed = await seed(db, "p-1", status="processed", event_type="order.paid")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        preview = await client.get(
            "/console/bulk-retry",
            params=[("event_type", "order.paid"), ("status", "dead"), ("status", "processed")],
        )
        statuses_before = [await status_of(db, m) for m in matching]
        done = await client.post(
            "/console/bulk-retry",
            content=urlencode(
                [
                    ("csrf_token", csrf),
                    ("event_type", "order.paid"),
                    ("status", "dead"),
                    ("status", "processed"),
                ]
            ),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert preview.status_code == 200
    assert "<strong>3</strong> messages" in preview.text
    assert "Not retried in bulk: processed" in preview.text
    assert statuses_before == ["dead"] * 3  # the dry run changed nothing
    assert "Retried 3 of 3" in done.text
    assert [await status_of(db, m) for m in matching] == ["pending"] * 3
    assert await status_of(db, other) == "dead"
    assert await status_of(db, processed) == "processed"


async def test_filters_live_in_the_url_and_pages_keep_them(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    dead = [await seed(db, f"d-{i}", status="dead", age=timedelta(minutes=i)) for i in range(3)]
    await seed(db, "p-1", status="processed")
    await seed(db, "o-1", status="dead", source="other")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        blank = await client.get(
            "/console/messages?source=hooks&status=dead&event_type=&message_id=&limit=2"
        )
        first = await client.get(blank.headers["location"])
        next_link = first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
        second = await client.get(next_link.replace("&amp;", "&"))
        invalid = await client.get("/console/messages?source=Not%20A%20Source")
    assert blank.status_code == 303
    assert blank.headers["location"] == "/console/messages?source=hooks&status=dead&limit=2"
    assert [f">{m}</a>" in first.text for m in dead] == [True, True, False]
    assert "source=hooks" in next_link
    assert "cursor=" in next_link
    assert [f">{m}</a>" in second.text for m in dead] == [False, False, True]
    assert 'value="hooks" selected' in second.text
    assert invalid.status_code == 200
    assert "cannot be used" in invalid.text


async def test_the_overview_shows_the_stats_and_refreshes_itself(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    for i in range(2):
        message = await seed(db, f"d-{i}", status="dead")
        await seed_attempt(db, message, 1, "dead", error="boom")
    await seed(db, "p-1", status="pending", age=timedelta(minutes=7))
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        overview = await client.get("/console/")
        live = await client.get("/console/overview/live")
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
    assert stats["by_status"]["dead"] == 2
    assert "<strong>2</strong> dead letters need" in overview.text
    assert "7 min" in overview.text  # the backlog's oldest age
    assert 'data-refresh-url="/console/overview/live"' in overview.text
    assert live.text.startswith('<div id="overview-live" data-refresh-url=')
    assert "<html" not in live.text
    for series in ("Received: 3", "Processed: 0", "Failed: 2"):
        assert series in live.text


async def test_static_files_are_cached_and_part_of_the_package(client_for: AppFactory) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        versioned = await client.get(asset_url("console.css"))
        plain = await client.get("/console/static/console.js")
        missing = await client.get("/console/static/nothing.js")
    assert versioned.status_code == 200
    assert versioned.headers["content-type"].startswith("text/css")
    assert versioned.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert plain.headers["cache-control"] == "no-cache"
    assert "etag" in plain.headers
    assert missing.status_code == 404
    package = files("service.api.console")
    for name in ("static/console.css", "static/console.js", "templates/base.html"):
        assert package.joinpath(name).is_file()


def test_a_session_cookie_is_refused_when_altered_or_expired() -> None:
    key = session_key([TOKEN])
    session = new_session("token:abc", 1000.0)
    cookie = encode_session(key, session)
    assert decode_session(key, cookie, 1000.0) == session
    assert decode_session(key, cookie, session.expires_at) is None
    assert decode_session(session_key(["another-token"]), cookie, 1000.0) is None
    payload, mac = cookie.split(".")
    assert decode_session(key, payload[:-1] + "x." + mac, 1000.0) is None
    assert decode_session(key, "not-a-cookie", 1000.0) is None
    assert new_session(None, 0).nonce != new_session(None, 0).nonce


async def test_the_attempt_history_reads_in_order_across_a_console_retry(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    dead = await seed(db, "m-dead", status="dead", attempts=2)
    await seed_attempt(db, dead, 1, "failed", error="boom")
    await seed_attempt(db, dead, 2, "dead", error="boom")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        await client.post(f"/console/messages/{dead}/retry", data={"csrf_token": csrf})
        # What the worker records for the retry's first attempt: number 3, not 1.
        row = await db.fetchrow("SELECT attempts, budget_start FROM inbox_messages")
        await seed_attempt(db, dead, row["attempts"] + 1, "processed")
        page = await client.get(f"/console/messages/{dead}")
    rows = re.findall(
        r'<td class="num">(\d+)</td>.*?outcome-([a-z_]+)"', page.text, flags=re.DOTALL
    )
    assert rows == [("1", "failed"), ("2", "dead"), ("2", "admin_retry"), ("3", "processed")]
    assert (row["attempts"], row["budget_start"]) == (2, 2)


async def test_the_outbox_page_shows_each_endpoint_and_links_its_messages(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # The URL is the operator's: its password hidden, the rest (markup included) as text.
    hostile_url = "https://user:s3cret@crm.example/hook?q=" + HOSTILE
    config = {**CONFIG, "endpoints": {"crm": {"url": hostile_url, "secret": "whsec_" + "A" * 32}}}
    dead = await seed(db, "out-1", source="outbox:crm", status="dead", last_error=HOSTILE)
    await seed(db, "out-2", source="outbox:crm", status="pending", age=timedelta(minutes=7))
    await seed(db, "in-1", source="hooks", status="dead")
    await db.execute(
        "INSERT INTO inbox_breakers (source, failures, open_until, opened_at, last_error) "
        "VALUES ('outbox:crm', 20, now() + interval '1 hour', now(), $1)",
        HOSTILE,
    )
    async with client_for(config, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        paused = await client.post(
            "/admin/sources/outbox:crm/pause",
            json={"operator": "Ada", "reason": "crm is migrating"},
            headers=AUTH,
        )
        outbox = await client.get("/console/outbox")
        listed = await client.get("/console/messages?source=outbox:crm&status=dead")
        overview = await client.get("/console/")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        none = await client.get("/console/outbox")
    assert paused.status_code == 200, paused.text
    assert outbox.status_code == 200
    assert 'aria-current="page">Outbox</a>' in outbox.text
    row = outbox.text.split('id="endpoint-crm"')[1].split("</tr>")[0]
    assert "s3cret" not in outbox.text
    assert "<script>alert" not in outbox.text
    assert "img" not in page_parts(outbox.text).elements
    assert str(escape(HOSTILE)) in row  # in the URL and in the breaker's last error
    assert ">yes</td>" in row  # signed
    link = "/console/messages?" + urlencode({"source": "outbox:crm", "status": "dead"})
    assert f'href="{escape(link)}" aria-label="1 dead">1</a>' in row
    assert "7 min" in row  # the oldest unsent
    assert ">open</span>" in row
    assert "paused</span> by Ada: crm is migrating" in row
    # The overview counts the endpoint's messages as an endpoint's, linked to the Outbox page.
    counted = overview.text.split(">outbox:crm</a></th>")[1].split("</tr>")[0]
    assert "<td>outbox endpoint</td>" in counted
    assert '<a href="/console/outbox">the outbox</a>' in counted
    assert listed.status_code == 200
    assert f">{dead}</a>" in listed.text
    assert ">in-1</a>" not in listed.text
    assert 'value="outbox:crm" selected>outbox:crm</option>' in listed.text
    assert none.status_code == 200
    assert "No endpoint is configured" in none.text
    assert "[endpoints.NAME]" in none.text


async def test_the_overview_shows_the_broker_consumers_with_a_source_no_one_consumes(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # Nothing connects here: the rows are what consumer processes would have written.
    rabbit = {"kind": "rabbitmq", "url": "amqp://guest:guest@127.0.0.1:5672/", "message_id": "/id"}
    sources = {
        **CONFIG["sources"],
        "orders": {**rabbit, "queue": "orders"},
        "refunds": {**rabbit, "queue": "refunds"},
    }
    insert = (
        "INSERT INTO inbox_consumers (source, consumer, connected, state, last_error, lag, "
        "counts, updated_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, now() - make_interval(secs => $8))"
    )
    counts = '{"accepted": 41, "duplicate": 3, "dead_lettered": 2}'
    await db.execute(insert, "orders", "a:1", True, "connected", None, 7, counts, 1)
    # Disconnected, and a second process that died without its clean stop: neither serves.
    await db.execute(insert, "refunds", "b:2", False, "disconnected", HOSTILE, None, "{}", 1)
    await db.execute(insert, "refunds", "c:3", True, "connected", None, 0, "{}", 60)
    async with client_for({**CONFIG, "sources": sources}, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        overview = await client.get("/console/")
        live = await client.get("/console/overview/live")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        without = await client.get("/console/overview/live")
    for response in (overview, live):
        assert response.status_code == 200
        assert "<script>alert" not in response.text
        assert "img" not in page_parts(response.text).elements
        assert page_parts(response.text).handlers == []
    section = live.text.split('<h2 id="consumers-title">Consumers</h2>')[1].split("</section>")[0]
    rows = [row.split("</tr>")[0] for row in section.split("<tr ")[1:]]
    cells = [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, flags=re.DOTALL) for row in rows]
    assert len(rows) == 4  # refunds's warning, then the 3 consumers' rows (orders is served)
    assert rows[0].startswith('class="consumer-missing"')
    assert cells[0][0] == '<a href="/console/sources/refunds">refunds</a>'
    assert "no consumer connected" in cells[0][1]
    assert [c[:8] for c in cells[1:]] == [
        ["orders", "a:1", "connected", "yes", "7", "41", "3", "2"],
        ["refunds", "b:2", "disconnected", "no", "—", "0", "0", "0"],
        ["refunds", "c:3", cells[3][2], "yes", "0", "0", "0", "0"],
    ]
    assert cells[3][2].startswith("connected <span")
    assert ">stale</span>" in cells[3][2]
    assert cells[1][8] == ""  # connected: no error shown
    assert cells[2][8] == str(escape(HOSTILE))  # why it lost the broker, as text
    assert section in overview.text  # the page's first render is the live part's
    assert without.status_code == 200
    assert "Consumers" not in without.text
    assert 'id="consumers"' not in without.text


ISSUE = "0123456789abcdef"
OTHER_ISSUE = "fedcba9876543210"


async def seed_issue(
    db: asyncpg.Connection,
    fingerprint: str,
    *,
    status: str = "open",
    error: str = "boom",
    error_type: str = "RuntimeError",
    source: str = "hooks",
    age: timedelta = timedelta(0),
) -> None:
    """An issue's row, as the worker would have written it."""
    await db.execute(
        "INSERT INTO inbox_issues (fingerprint, source, handler, error_type, frame, status, "
        "first_seen, last_seen, failed_attempts, sample_error, sample_traceback) "
        "VALUES ($1, $2, 'tests.handlers:record', $3, 'app.charges:charge', $4, "
        "now() - $5::interval, now() - $5::interval, 3, $6, $6)",
        fingerprint,
        source,
        error_type,
        status,
        age,
        error,
    )


async def seed_failed(
    db: asyncpg.Connection, message_id: str, fingerprint: str, *, status: str = "dead"
) -> int:
    """A message whose latest failed attempt has `fingerprint`."""
    row = await seed(db, message_id, status=status, attempts=1, last_error="boom")
    await db.execute(
        "INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome, "
        "error_type, error, fingerprint) VALUES ($1, 1, now(), now(), $2, 'RuntimeError', "
        "'boom', $3)",
        row,
        "dead" if status == "dead" else "failed",
        fingerprint,
    )
    return row


async def test_the_issues_page_lists_unsettled_issues_first_and_renders_them_as_text(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await seed_issue(db, ISSUE, error=HOSTILE, error_type=HOSTILE)
    await seed_issue(db, OTHER_ISSUE, status="resolved")  # more recent, but settled
    await seed_issue(db, "aaaaaaaaaaaaaaaa", status="acknowledged", age=timedelta(hours=1))
    await seed_failed(db, "m-1", ISSUE)
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        listed = await client.get("/console/issues")
        only_resolved = await client.get("/console/issues", params={"status": "resolved"})
        other_source = await client.get("/console/issues", params={"source": "other"})
        detail = await client.get(f"/console/issues/{ISSUE}")
        overview = await client.get("/console/")
        unknown = await client.get("/console/issues/0000000000000000")
        malformed = await client.get("/console/issues/not-a-fingerprint")
    for response in (listed, detail, overview):
        assert response.status_code == 200
        assert "<script>alert" not in response.text
        parts = page_parts(response.text)
        assert "img" not in parts.elements
        assert parts.handlers == []
    order = re.findall(r'id="issue-([0-9a-f]{16})"', listed.text)
    assert order == [ISSUE, "aaaaaaaaaaaaaaaa", OTHER_ISSUE]
    assert escape(HOSTILE) in listed.text
    assert re.findall(r'id="issue-([0-9a-f]{16})"', only_resolved.text) == [OTHER_ISSUE]
    assert "No issues match." in other_source.text
    assert f'<pre id="issue-error" class="error-cell">{escape(HOSTILE)}</pre>' in detail.text
    assert f'<pre id="issue-traceback">{escape(HOSTILE)}</pre>' in detail.text
    assert 'href="/console/messages/' in detail.text  # its message links to its page
    for action in ("acknowledge", "resolve", "ignore"):
        assert f"/console/issues/{ISSUE}/{action}" in detail.text
    assert csrf_of(detail.text)
    assert f'href="/console/issues/{ISSUE}"' in overview.text  # open: on the overview
    assert f'href="/console/issues/{OTHER_ISSUE}"' not in overview.text
    assert (unknown.status_code, malformed.status_code) == (404, 404)


async def test_the_overview_has_no_issues_section_without_open_issues(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await seed_issue(db, ISSUE, status="ignored")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await sign_in(client)
        overview = await client.get("/console/overview/live")
    assert "Open issues" not in overview.text


async def test_issue_decisions_need_the_csrf_token_and_keep_who_and_why(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await seed_issue(db, ISSUE)
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        path = f"/console/issues/{ISSUE}"
        refused = await client.post(f"{path}/acknowledge", data={"operator": "ada"})
        nameless = await client.post(f"{path}/acknowledge", data={"csrf_token": csrf})
        acknowledged = await client.post(
            f"{path}/acknowledge", data={"csrf_token": csrf, "operator": "ada", "note": HOSTILE}
        )
        shown = await client.get(acknowledged.headers["location"])
        reopened = await client.post(f"{path}/reopen", data={"csrf_token": csrf, "operator": "bo"})
        statuses = [await db.fetchval("SELECT status FROM inbox_issues")]
        await client.post(f"{path}/ignore", data={"csrf_token": csrf, "operator": "bo"})
        statuses.append(await db.fetchval("SELECT status FROM inbox_issues"))
        await client.post(f"{path}/resolve", data={"csrf_token": csrf, "operator": "cy"})
        statuses.append(await db.fetchval("SELECT status FROM inbox_issues"))
    assert (refused.status_code, nameless.status_code) == (403, 422)
    assert acknowledged.status_code == 303
    assert acknowledged.headers["location"] == f"{path}?done=acknowledge"
    assert "Acknowledged" in shown.text
    assert f"by <strong>ada</strong>: {escape(HOSTILE)}" in shown.text
    assert reopened.status_code == 303
    assert statuses == ["open", "ignored", "resolved"]
    row = await db.fetchrow("SELECT acknowledged_by, note FROM inbox_issues")
    assert (row["acknowledged_by"], row["note"]) == ("cy", HOSTILE)


async def test_resolve_and_retry_counts_first_then_retries_only_that_issues_dead_messages(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await seed_issue(db, ISSUE)
    await seed_issue(db, OTHER_ISSUE)
    mine = [await seed_failed(db, f"m-{i}", ISSUE) for i in range(2)]
    retrying = await seed_failed(db, "m-retrying", ISSUE, status="retrying")
    others = await seed_failed(db, "m-other", OTHER_ISSUE)
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        confirm = await client.get(f"/console/issues/{ISSUE}/retry")
        before = [await status_of(db, m) for m in mine]
        refused = await client.post(f"/console/issues/{ISSUE}/retry", data={"operator": "ada"})
        done = await client.post(
            f"/console/issues/{ISSUE}/retry", data={"csrf_token": csrf, "operator": "ada"}
        )
        shown = await client.get(f"/console/issues/{ISSUE}")
    assert confirm.status_code == 200
    assert "<strong>2</strong> dead messages will be retried" in confirm.text
    assert f'action="/console/issues/{ISSUE}/retry"' in confirm.text
    assert csrf_of(confirm.text) == csrf
    assert before == ["dead", "dead"]  # the dry run changed nothing
    assert refused.status_code == 403
    assert "Retried 2 of 2" in done.text
    assert [await status_of(db, m) for m in mine] == ["pending", "pending"]
    assert await status_of(db, retrying) == "retrying"
    assert await status_of(db, others) == "dead"
    issues = dict(await db.fetch("SELECT fingerprint, status FROM inbox_issues"))
    assert issues == {ISSUE: "resolved", OTHER_ISSUE: "open"}
    assert (
        await db.fetchval("SELECT acknowledged_by FROM inbox_issues WHERE fingerprint = $1", ISSUE)
        == "ada"
    )
    actors = await db.fetch("SELECT actor FROM inbox_attempts WHERE outcome = 'admin_retry'")
    assert [a["actor"] for a in actors] == [CONSOLE_ACTOR] * 2
    assert 'status-resolved">resolved' in shown.text


async def test_a_bulk_discard_counts_first_then_shows_the_recorded_actions_progress(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    matching = [await seed(db, f"d-{i}", status="dead", event_type="order.paid") for i in range(3)]
    other = await seed(db, "d-other", status="dead", event_type="order.created")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        csrf = await sign_in(client)
        retry_preview = await client.get("/console/bulk-retry", params={"event_type": "order.paid"})
        preview = await client.get(
            "/console/bulk-action", params={"action": "discard", "event_type": "order.paid"}
        )
        statuses_before = [await status_of(db, m) for m in matching]
        started = await client.post(
            "/console/bulk-action",
            content=urlencode(
                [("csrf_token", csrf), ("action", "discard"), ("event_type", "order.paid")]
            ),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert started.status_code == 303, started.text
        for _ in range(100):
            progress = await client.get(started.headers["location"])
            if "Finished" in progress.text:
                break
            await asyncio.sleep(0.05)
    assert "/console/bulk-action?action=discard&amp;event_type=order.paid" in retry_preview.text
    assert "<strong>3</strong> messages would be discarded" in preview.text
    assert statuses_before == ["dead"] * 3  # the dry run changed nothing
    assert "Finished: 3 of 3 changed (100%)" in progress.text
    assert [await status_of(db, m) for m in matching] == ["discarded"] * 3
    assert await status_of(db, other) == "dead"
