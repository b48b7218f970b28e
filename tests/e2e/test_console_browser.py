"""The console in a real browser: Debian's chromium, driven by Playwright, against the real
`webhook-inbox serve` (HTTP and processing processes) on the test's database.

A browser that cannot start fails these tests; `make test` installs chromium when missing.
Set CONSOLE_SCREENSHOTS_DIR=docs to refresh the README's screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from service.api.security import token_fingerprint
from service.sources.github import github_signature
from tests.admin_seed import AUTH, TOKEN, seed
from tests.console_handlers import DOWN_FLAG_ENV
from tests.pg import asyncpg_dsn, empty_tables
from tests.processing_helpers import create_effects, wait_until
from tests.server import ServerProcess, serve_env
from tests.worker_process import wait_listening

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CONSOLE_ACTOR = "console:" + token_fingerprint(TOKEN)
SETTLE = 30_000  # ms: how long the browser may wait for the worker

SOURCES_TOML = """
[sources.billing]
kind = "generic"
id_json_pointer = "/id"
event_type_json_pointer = "/type"
handlers = ["tests.console_handlers:billing"]
search_payload = true
max_attempts = 3
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2

[sources.routed]
kind = "generic"
id_json_pointer = "/id"
event_type_json_pointer = "/type"
max_attempts = 2
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2

[sources.routed.destinations.ledger]
handlers = ["tests.handlers:record_warehouse"]

[sources.routed.destinations.billing]
handlers = ["tests.console_handlers:billing"]

[sources.github]
kind = "generic"
id_header = "x-github-delivery"
event_type_header = "x-github-event"

[sources.shop]
kind = "generic"
id_json_pointer = "/id"
event_type_json_pointer = "/type"
ordering_key = "/data/customer"
rate_limit = "50/s"

[sources.shop.destinations.ledger]
event_types = ["invoice.*"]
handlers = ["tests.handlers:record_warehouse"]
rate_limit = "30/m"

[sources.shop.destinations.audit]
event_types = ["refund.*"]
handlers = ["tests.handlers:record_billing"]

[sources.signed]
kind = "github"
secrets = ["console-test-github-secret"]

# The Outbox page's endpoint; nothing listens there, and its test pauses it before staging.
[endpoints.crm]
url = "http://127.0.0.1:9/crm"
"""


class Console:
    """A running `serve` and the things a test does to it besides browsing."""

    def __init__(self, server: ServerProcess, down_flag: Path, db: asyncpg.Connection) -> None:
        self.server = server
        self.url = server.url
        self.down_flag = down_flag
        self.db = db

    def billing_down(self, down: bool) -> None:
        if down:
            self.down_flag.touch()
        else:
            self.down_flag.unlink(missing_ok=True)

    async def deliver(
        self,
        message_id: str,
        amount: int = 4200,
        kind: str = "invoice.paid",
        source: str = "billing",
    ) -> None:
        body = {"id": message_id, "type": kind, "data": {"amount": amount, "customer": "cus_42"}}
        async with httpx.AsyncClient(base_url=self.url) as client:
            response = await client.post(f"/webhooks/{source}", json=body)
        assert response.json()["status"] == "accepted"

    async def status(self, message_id: str) -> str | None:
        value: str | None = await self.db.fetchval(
            "SELECT status FROM inbox_messages WHERE message_id = $1", message_id
        )
        return value

    async def wait_status(self, message_id: str, status: str) -> None:
        query = f"SELECT status FROM inbox_messages WHERE message_id = '{message_id}'"
        await wait_until(self.db, query, status, 30)

    async def row_id(self, message_id: str) -> int:
        return int(
            await self.db.fetchval(
                "SELECT id FROM inbox_messages WHERE message_id = $1", message_id
            )
        )


@pytest.fixture(scope="module")
async def console_database(module_database: str) -> str:
    """The module's database, for its one server; each test starts from emptied tables."""
    conn = await asyncpg.connect(asyncpg_dsn(module_database))
    await create_effects(conn)
    await conn.close()
    return module_database


@pytest.fixture(scope="module")
def serving(
    console_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    workdir = tmp_path_factory.mktemp("console")
    down_flag = workdir / "billing-down"
    env = serve_env(
        workdir,
        SOURCES_TOML,
        DATABASE_URL=console_database,
        INBOX_ADMIN_TOKENS=TOKEN,
        **{DOWN_FLAG_ENV: str(down_flag)},
    )
    with ServerProcess(env, workdir, startup_timeout=60) as server:
        yield server, down_flag


@pytest.fixture
async def console(
    serving: tuple[ServerProcess, Path], console_database: str
) -> AsyncIterator[Console]:
    server, down_flag = serving
    down_flag.unlink(missing_ok=True)
    # The issues too: the overview lists the open ones, and each test counts its own.
    await empty_tables(console_database, "effects", "inbox_issues")
    conn = await asyncpg.connect(asyncpg_dsn(console_database))
    await wait_listening(conn, 1)
    yield Console(server, down_flag, conn)
    await conn.close()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One browser for the module; each test gets a context (cookies, storage) of its own."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `make test` installs Debian's chromium"
    async with async_playwright() as playwright:
        # No download: Playwright drives the system's chromium.
        launched = await playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1366, "height": 900})
    opened = await context.new_page()
    dialogs: list[str] = []

    async def refuse(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    opened.on("dialog", refuse)
    yield opened
    await context.close()
    # No page may run a script of a message's (alert, confirm): each would have opened one.
    assert dialogs == []


async def sign_in(page: Page, console: Console, target: str = "/console/") -> None:
    await page.goto(console.url + target)
    await page.get_by_label("Admin token").fill(TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("button", name="Sign out")).to_be_visible()


async def dead_letter(console: Console, message_id: str, amount: int = 4200) -> None:
    console.billing_down(True)
    await console.deliver(message_id, amount)
    await console.wait_status(message_id, "dead")


async def test_sign_in_with_the_keyboard_and_see_a_dead_letter_on_the_overview(
    console: Console, page: Page
) -> None:
    await dead_letter(console, "evt_1")
    assert f"console: {console.url}/console/" in console.server.output()  # the banner's link
    await page.goto(console.url + "/console/")
    await expect(page).to_have_url(console.url + "/console/sign-in?next=%2Fconsole%2F")
    token = page.get_by_label("Admin token")
    await token.fill("not-the-token")
    await token.press("Enter")
    await expect(page.get_by_role("alert")).to_have_text("That is not an admin token.")
    await page.get_by_label("Admin token").fill(TOKEN)
    await page.get_by_label("Admin token").press("Enter")
    await expect(page).to_have_url(console.url + "/console/")
    alert = page.locator(".alert")
    await expect(alert).to_contain_text("1 dead letter needs an operator")
    await expect(page.get_by_role("row", name="billing")).to_contain_text("generic")
    await page.keyboard.press("Tab")
    await expect(page.locator(":focus")).to_have_text("Skip to content")
    await alert.get_by_role("link").click()
    await expect(page).to_have_url(console.url + "/console/dead-letters")
    group = page.locator("table.groups").get_by_role(
        "row", name="tests.console_handlers.BillingUnavailable"
    )
    await expect(group).to_contain_text("billing API refused the connection for evt_1")


async def test_the_overview_updates_itself_when_a_message_dies(
    console: Console, page: Page
) -> None:
    await sign_in(page, console)
    await expect(page.locator(".calm")).to_have_text("No dead letters.")
    await dead_letter(console, "evt_live")
    # No reload: the page's script swaps the figures in within its 5 s period.
    await expect(page.locator(".alert")).to_contain_text("1 dead letter", timeout=SETTLE)


async def test_a_dead_letter_is_read_then_retried_once_its_cause_is_fixed(
    console: Console, page: Page
) -> None:
    await dead_letter(console, "evt_42")
    await sign_in(page, console, "/console/dead-letters")
    await page.get_by_role("link", name=str(await console.row_id("evt_42")), exact=True).click()
    await expect(page.locator("#message-status")).to_have_text("dead")
    await expect(page.locator("#last-error")).to_contain_text(
        "BillingUnavailable: billing API refused the connection for evt_42"
    )
    await expect(page.locator("#message-body")).to_contain_text('"customer": "cus_42"')
    history = page.locator("table.history tbody tr")
    await expect(history).to_have_count(3)
    traceback = page.locator("table.history details").last
    await expect(traceback.locator("pre")).to_be_hidden()  # folded
    await traceback.locator("summary").click()
    await expect(traceback.locator("pre")).to_contain_text("Traceback (most recent call last)")

    console.billing_down(False)  # the cause, fixed
    await page.get_by_role("button", name="Retry").click()
    await expect(page.get_by_role("status")).to_contain_text("Retried")
    # The page follows the message until it is finished, without a reload.
    await expect(page.locator("#message-status")).to_have_text("processed", timeout=SETTLE)
    await expect(history).to_have_count(5)
    await expect(history.nth(3)).to_contain_text("admin_retry")
    await expect(history.nth(3)).to_contain_text(CONSOLE_ACTOR)
    await expect(history.nth(4)).to_contain_text("processed")
    assert await console.db.fetchval("SELECT count(*) FROM effects") == 1


async def test_one_dead_destination_is_retried_alone_from_the_message_page(
    console: Console, page: Page
) -> None:
    console.billing_down(True)
    await console.deliver("evt_routed", source="routed")
    await console.wait_status("evt_routed", "dead")
    row_id = await console.row_id("evt_routed")
    await sign_in(page, console, f"/console/messages/{row_id}")
    await expect(page.locator("#message-status")).to_have_text("dead")
    ledger, billing = page.locator("#destination-ledger"), page.locator("#destination-billing")
    await expect(ledger).to_contain_text("processed")
    await expect(billing).to_contain_text("dead")
    await expect(billing).to_contain_text("BillingUnavailable")
    await expect(ledger.get_by_role("button")).to_have_count(0)  # nothing to do for it
    history = page.locator("table.history")
    await expect(history.locator("thead")).to_contain_text("Destination")

    console.billing_down(False)
    await billing.get_by_role("button", name="Retry billing").click()
    await expect(page.get_by_role("status")).to_contain_text("Retried that destination")
    await expect(page.locator("#message-status")).to_have_text("processed", timeout=SETTLE)
    await expect(page.locator("#destination-billing")).to_contain_text("processed")
    await expect(history.locator("tbody tr").last).to_contain_text("billing")
    rows = await console.db.fetch(
        "SELECT d.destination, d.attempts FROM inbox_destinations d "
        "JOIN inbox_messages m ON m.id = d.message_id WHERE m.message_id = 'evt_routed' "
        "ORDER BY 1"
    )
    assert [tuple(r) for r in rows] == [("billing", 3), ("ledger", 1)]  # ledger ran once
    assert await console.db.fetchval("SELECT count(*) FROM effects") == 2
    actor = await console.db.fetchval(
        "SELECT actor FROM inbox_attempts WHERE outcome = 'admin_retry' AND destination = 'billing'"
    )
    assert actor == CONSOLE_ACTOR


async def test_an_operator_pauses_a_source_with_a_reason_then_resumes_it(
    console: Console, page: Page
) -> None:
    await sign_in(page, console)
    row = page.get_by_role("row", name="billing")
    await row.get_by_role("link", name="running").click()
    await expect(page).to_have_url(console.url + "/console/sources/billing")
    await page.get_by_label("Your name").fill("Ada")
    await page.get_by_label("Reason").fill("billing API down, INC-4211")
    await page.get_by_role("button", name="Pause processing").click()
    await expect(page.get_by_role("status")).to_contain_text("Paused")
    await expect(page.locator("#pause-state")).to_contain_text("by Ada: billing API down, INC-4211")
    try:
        await console.deliver("evt_paused")  # accepted while paused
        await page.goto(console.url + "/console/")
        await expect(page.get_by_role("row", name="billing")).to_contain_text("paused by Ada")
        assert await console.status("evt_paused") == "pending"
        attempts = await console.db.fetchval("SELECT count(*) FROM inbox_attempts")
        assert attempts == 0
        actor = await console.db.fetchval("SELECT actor FROM inbox_source_pauses")
        assert actor == CONSOLE_ACTOR
    finally:
        await page.goto(console.url + "/console/sources/billing")
        await page.get_by_role("button", name="Resume").click()
    await expect(page.get_by_role("status")).to_contain_text("Resumed")
    await console.wait_status("evt_paused", "processed")


async def test_a_source_page_shows_its_configuration_destinations_counts_and_latest(
    console: Console, page: Page
) -> None:
    await console.deliver("evt_shop", source="shop")
    await console.wait_status("evt_shop", "processed")
    await sign_in(page, console, "/console/sources/shop")
    config = page.locator("#source-config")
    await expect(config).to_contain_text("generic")
    await expect(page.locator("#source-rate-limit")).to_have_text("50/s")
    await expect(page.locator("#source-ordering-key")).to_have_text("/data/customer")
    ledger = page.locator("#source-destination-ledger")
    await expect(ledger).to_contain_text("invoice.*")
    await expect(ledger).to_contain_text("tests.handlers:record_warehouse")
    await expect(ledger).to_contain_text("30/m")
    await expect(ledger).to_contain_text("processed 1")
    audit = page.locator("#source-destination-audit")
    await expect(audit).to_contain_text("refund.*")
    await expect(audit).to_contain_text("none yet")  # the event matched only the ledger
    counts = page.locator("#source-counts")
    await expect(counts.get_by_role("link", name="1")).to_have_attribute(
        "href", "/console/messages?source=shop&status=processed"
    )
    latest = page.locator("#source-latest table.messages tbody tr")
    await expect(latest).to_have_count(1)
    await expect(latest).to_contain_text("evt_shop")
    await expect(page.locator("#pause-state")).to_contain_text("Running")


async def test_the_outbox_page_counts_an_endpoints_messages_and_opens_its_dead_ones(
    console: Console, page: Page
) -> None:
    async with httpx.AsyncClient(base_url=console.url, headers=AUTH) as client:
        paused = await client.post(
            "/admin/sources/outbox:crm/pause", json={"operator": "Ada", "reason": "crm migrating"}
        )
    assert paused.status_code == 200, paused.text  # so that the relay leaves the pending one
    await seed(console.db, "out_refused", source="outbox:crm", status="dead", last_error="400")
    await seed(console.db, "out_waiting", source="outbox:crm", age=timedelta(minutes=3))
    await sign_in(page, console)
    await page.get_by_role("navigation").get_by_role("link", name="Outbox").click()
    await expect(page).to_have_url(console.url + "/console/outbox")
    row = page.get_by_role("row", name="crm")
    await expect(row).to_contain_text("http://127.0.0.1:9/crm")
    await expect(row.get_by_role("link", name="1 pending")).to_be_visible()
    await expect(row).to_contain_text("3 min")  # the oldest unsent
    await expect(row).to_contain_text("paused by Ada: crm migrating")
    await row.get_by_role("link", name="1 dead").click()
    await expect(page).to_have_url(
        console.url + "/console/messages?source=outbox%3Acrm&status=dead"
    )
    await expect(page.get_by_label("Source")).to_have_value("outbox:crm")
    listed = page.locator("table.messages tbody tr")
    await expect(listed).to_have_count(1)
    await expect(listed).to_contain_text("out_refused")


async def test_bulk_retry_of_a_filter_after_its_dry_run_count(console: Console, page: Page) -> None:
    for i in range(3):
        await dead_letter(console, f"evt_paid_{i}")
    console.billing_down(True)
    await console.deliver("evt_created", kind="invoice.created")
    await console.wait_status("evt_created", "dead")
    console.billing_down(False)
    await sign_in(page, console, "/console/messages")
    await page.get_by_label("dead").check()
    await page.get_by_label("Event type").fill("invoice.paid")
    await page.get_by_role("button", name="Filter").click()
    await expect(page).to_have_url(
        console.url + "/console/messages?status=dead&event_type=invoice.paid"
    )
    await expect(page.locator("table.messages tbody tr")).to_have_count(3)
    await page.get_by_role("link", name="Retry the failed messages matching these filters…").click()
    await expect(page.locator("#matched")).to_contain_text("3 messages in status dead")
    assert await console.status("evt_paid_0") == "dead"  # counting changed nothing
    await page.get_by_role("button", name="Retry 3 messages").click()
    await expect(page.locator("#bulk-result")).to_have_text("Retried 3 of 3 matching messages.")
    for i in range(3):
        await console.wait_status(f"evt_paid_{i}", "processed")
    assert await console.status("evt_created") == "dead"


async def test_retry_all_of_one_error_type_from_the_dead_letters(
    console: Console, page: Page
) -> None:
    console.billing_down(False)
    await console.deliver("evt_negative", amount=-5)
    await console.wait_status("evt_negative", "dead")
    await dead_letter(console, "evt_down_1")
    await dead_letter(console, "evt_down_2")
    console.billing_down(False)
    await sign_in(page, console, "/console/dead-letters")
    await expect(
        page.locator("table.groups").get_by_role("row", name="ValueError")
    ).to_contain_text("1")
    group = page.locator("table.groups").get_by_role(
        "row", name="tests.console_handlers.BillingUnavailable"
    )
    await group.get_by_role("link", name="Retry all 2…").click()
    await expect(page.locator("#matched")).to_contain_text("2 messages")
    await page.get_by_role("button", name="Retry 2 messages").click()
    await expect(page.locator("#bulk-result")).to_contain_text("Retried 2 of 2")
    await console.wait_status("evt_down_1", "processed")
    await console.wait_status("evt_down_2", "processed")
    assert await console.status("evt_negative") == "dead"


async def test_the_message_id_an_operator_has_in_hand_opens_its_page(
    console: Console, page: Page
) -> None:
    # The sender's id (a Stripe event id, a GitHub delivery id) is what a support ticket
    # quotes: typed into the filter, then clicked in the list, as the inbox id is.
    await console.deliver("evt_other")
    await dead_letter(console, "evt_from_ticket")
    row_id = await console.row_id("evt_from_ticket")
    await sign_in(page, console, "/console/messages")
    await page.get_by_label("Message id").fill("evt_from_ticket")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator("table.messages tbody tr")).to_have_count(1)
    await page.get_by_role("link", name="evt_from_ticket", exact=True).click()
    await expect(page).to_have_url(f"{console.url}/console/messages/{row_id}")
    await expect(page.locator("h1")).to_contain_text("evt_from_ticket")
    # The dead-letter list is the same table: its message ids lead to the page too.
    await page.goto(console.url + "/console/dead-letters")
    await page.get_by_role("link", name="evt_from_ticket", exact=True).click()
    await expect(page).to_have_url(f"{console.url}/console/messages/{row_id}")


async def test_discard_sets_one_message_aside(console: Console, page: Page) -> None:
    await dead_letter(console, "evt_discard")
    await dead_letter(console, "evt_keep")
    await sign_in(page, console, f"/console/messages/{await console.row_id('evt_discard')}")
    await page.get_by_role("button", name="Discard").click()
    await expect(page.get_by_role("status")).to_contain_text("Discarded")
    await expect(page.locator("#message-status")).to_have_text("discarded")
    await expect(page.locator("table.history tbody tr").last).to_contain_text(CONSOLE_ACTOR)
    assert await console.status("evt_discard") == "discarded"
    assert await console.status("evt_keep") == "dead"


async def test_replay_says_the_handlers_run_again_then_runs_them(
    console: Console, page: Page
) -> None:
    await console.deliver("evt_done")
    await console.wait_status("evt_done", "processed")
    await sign_in(page, console, f"/console/messages/{await console.row_id('evt_done')}")
    await page.get_by_role("link", name="Replay…").click()
    await expect(page.locator(".confirm")).to_contain_text("The handlers run again.")
    assert await console.db.fetchval("SELECT count(*) FROM effects") == 1
    await page.get_by_role("button", name="Replay message").click()
    await expect(page.get_by_role("status")).to_contain_text("Replayed")
    await expect(page.locator("table.history tbody tr")).to_have_count(3, timeout=SETTLE)
    await expect(page.locator("#message-status")).to_have_text("processed")
    assert await console.db.fetchval("SELECT count(*) FROM effects") == 2


async def test_after_signing_out_the_console_refuses(console: Console, page: Page) -> None:
    await sign_in(page, console)
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("status")).to_have_text("You have signed out.")
    await page.goto(console.url + "/console/messages")
    await expect(page).to_have_url(console.url + "/console/sign-in?next=%2Fconsole%2Fmessages")
    live = await page.request.get(console.url + "/console/overview/live")
    assert live.status == 401


async def test_a_badly_signed_delivery_is_listed_with_its_reason_on_the_rejected_page(
    console: Console, page: Page
) -> None:
    body = b'{"zen": "rejected-body-marker"}'
    async with httpx.AsyncClient(base_url=console.url) as client:
        refused = await client.post(
            "/webhooks/signed",
            content=body,
            headers={
                "content-type": "application/json",
                "x-github-event": "ping",
                "x-github-delivery": "delivery-signed-by-someone-else",
                "x-hub-signature-256": github_signature(b"someone-elses-secret", body),
            },
        )
    assert refused.status_code == 401
    # Refusals are written in the background (every half second): open the page once it is.
    rows = "SELECT count(*) FROM inbox_rejected_deliveries WHERE source = 'signed'"
    await wait_until(console.db, rows, 1)
    await sign_in(page, console)
    await page.get_by_role("link", name="Rejected").click()
    await page.get_by_label("Source").select_option("signed")
    await page.get_by_role("button", name="Filter").click()
    await expect(page).to_have_url(console.url + "/console/rejected?source=signed")
    row = page.locator("table.rejected tbody tr")
    await expect(row).to_have_count(1)
    await expect(row).to_contain_text("401")
    await expect(row).to_contain_text("unauthenticated")
    await expect(row).to_contain_text("X-Hub-Signature-256 does not match a configured secret")
    await row.get_by_text("headers").click()  # unfolds them
    headers = row.locator("dl.headers")
    await expect(headers).to_contain_text("delivery-signed-by-someone-else")
    await expect(headers).to_contain_text("[redacted]")  # the signature
    await expect(page.locator("main")).not_to_contain_text("rejected-body-marker")  # no body


HOSTILE = '<script>alert("body")</script>"><img src=x onerror=alert(1)>'


async def test_a_payload_with_html_in_it_renders_as_text(console: Console, page: Page) -> None:
    async with httpx.AsyncClient(base_url=console.url) as client:
        await client.post(
            "/webhooks/github",
            content=HOSTILE,
            headers={
                "x-github-delivery": '"><img src=x onerror=alert(2)>',
                "x-github-event": "<script>alert(3)</script>",
                "content-type": "text/html",
            },
        )
        await client.post(
            "/webhooks/billing",
            json={"id": "evt_html", "type": "x", "data": {"note": HOSTILE}},
        )
    await console.wait_status('"><img src=x onerror=alert(2)>', "processed")
    await sign_in(page, console, "/console/messages")
    await expect(page.locator("table.messages")).to_contain_text("<script>alert(3)</script>")
    for message_id, shown in (
        ('"><img src=x onerror=alert(2)>', HOSTILE),
        ("evt_html", json.dumps(HOSTILE)),
    ):
        await page.goto(f"{console.url}/console/messages/{await console.row_id(message_id)}")
        await expect(page.locator("#message-body")).to_contain_text(shown)
        assert await page.locator("main img").count() == 0
        assert await page.locator("main script").count() == 0


async def test_screenshots_of_the_overview_and_a_message(
    console: Console, page: Page, tmp_path: Path
) -> None:
    await seed_an_hour(console.db)
    await dead_letter(console, "evt_1042", amount=4200)
    console.billing_down(False)
    for i in range(3):
        await console.deliver(f"evt_{1050 + i}")
    await sign_in(page, console)
    await expect(page.locator(".alert")).to_be_visible()
    shots = {
        "console-overview.png": "/console/",
        "console-message.png": f"/console/messages/{await console.row_id('evt_1042')}",
    }
    for name, path in shots.items():
        await page.goto(console.url + path)
        await page.screenshot(path=tmp_path / name, full_page=True)
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("CONSOLE_SCREENSHOTS_DIR")
    if target:
        for name in shots:
            shutil.copyfile(tmp_path / name, Path(target) / name)


async def seed_an_hour(db: asyncpg.Connection) -> None:
    """An hour of traffic on a second source, for a chart worth looking at."""
    for minute in range(58, 0, -1):
        for n in range(2 + (minute * 7) % 5):
            row = await seed(
                db,
                f"delivery-{minute}-{n}",
                source="github",
                status="processed",
                event_type="push",
                age=timedelta(minutes=minute, seconds=n),
            )
            failed = (minute % 9 == 0) and n == 0
            await db.execute(
                "INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, "
                "outcome, error_type, error, duration_ms) "
                "VALUES ($1, 1, now() - $2::interval, now() - $2::interval, $3, $4, $5, 4)",
                row,
                timedelta(minutes=minute, seconds=n - 1),
                "failed" if failed else "processed",
                "TimeoutError" if failed else None,
                "upstream timed out" if failed else None,
            )


async def test_the_live_view_shows_deliveries_duplicates_and_outcomes_as_they_happen(
    console: Console, page: Page
) -> None:
    await sign_in(page, console)
    await page.get_by_role("link", name="Live").click()
    await expect(page).to_have_url(console.url + "/console/tail")
    await page.get_by_label("Source").select_option("billing")
    await page.get_by_role("button", name="Filter").click()
    await expect(page).to_have_url(console.url + "/console/tail?source=billing")
    await expect(page.get_by_role("status")).to_contain_text("Following", timeout=SETTLE)

    await console.deliver("evt_paid")
    await console.wait_status("evt_paid", "processed")  # its duplicate is counted on its row
    async with httpx.AsyncClient(base_url=console.url) as client:
        body = {"id": "evt_paid", "type": "invoice.paid", "data": {"amount": 1}}
        response = await client.post("/webhooks/billing", json=body)
    assert response.json()["status"] == "duplicate"
    await console.deliver("evt_other", source="routed")  # another source: not shown
    console.billing_down(True)
    await console.deliver("evt_down")
    await console.wait_status("evt_down", "dead")

    rows = page.locator("table.live tbody tr")
    paid = rows.filter(has_text="evt_paid")
    await expect(paid.filter(has_text="accepted")).to_have_count(1, timeout=SETTLE)
    await expect(paid.filter(has_text="duplicate (delivery 2)")).to_have_count(1, timeout=SETTLE)
    await expect(paid.filter(has_text="processed (attempt 1)")).to_have_count(1, timeout=SETTLE)
    down = rows.filter(has_text="evt_down")
    await expect(down.filter(has_text="dead (attempt 3)")).to_contain_text(
        "BillingUnavailable: billing API refused the connection for evt_down", timeout=SETTLE
    )
    await expect(down.filter(has_text="failed (attempt 1)")).to_have_count(1)
    await expect(rows.filter(has_text="evt_other")).to_have_count(0)
    # Newest on top; each row opens its message.
    await expect(rows.first).to_contain_text("dead (attempt 3)")
    await rows.first.get_by_role("link", name="evt_down").click()
    await expect(page.locator("#message-status")).to_have_text("dead")


async def test_an_open_issue_is_found_on_the_overview_then_resolved_and_retried(
    console: Console, page: Page
) -> None:
    await dead_letter(console, "evt_down_a")
    await dead_letter(console, "evt_down_b")
    console.billing_down(False)
    await console.deliver("evt_negative", amount=-5)  # another cause: another issue
    await console.wait_status("evt_negative", "dead")
    await sign_in(page, console)
    issues = page.locator("#open-issues")
    await expect(issues.get_by_role("link")).to_have_count(3)  # two issues and "All issues"
    await issues.get_by_role("link", name="BillingUnavailable", exact=False).click()
    await expect(page.locator("#issue-status")).to_have_text("open")
    await expect(page.locator("#issue-error")).to_contain_text("billing API refused")
    await expect(page.locator("table.messages tbody tr")).to_have_count(2)

    await page.get_by_role("link", name="Resolve and retry its dead messages…").click()
    await expect(page.locator("#matched")).to_contain_text("2 dead messages will be retried")
    assert await console.status("evt_down_a") == "dead"  # counting changed nothing
    await page.get_by_label("Your name").fill("ada")
    await page.get_by_role("button", name="Resolve and retry 2 messages").click()
    await expect(page.locator("#bulk-result")).to_have_text("Retried 2 of 2 matching messages.")
    await page.get_by_role("link", name="Back to the issue").click()
    await expect(page.locator("#issue-status")).to_have_text("resolved")
    await expect(page.locator("#issue-decision")).to_contain_text("Resolved by ada")
    for message_id in ("evt_down_a", "evt_down_b"):
        await console.wait_status(message_id, "processed")
    await page.reload()
    await expect(page.locator("table.messages .status-processed")).to_have_count(2)
    assert await console.status("evt_negative") == "dead"  # the other issue's message


async def test_a_search_finds_exactly_its_rows_says_what_is_wrong_and_exports_them(
    console: Console, page: Page
) -> None:
    """Issue 67: free text and a payload condition find exactly their messages, keep their
    values across pages, a bad condition is answered with the API's words on the page, and the
    export link downloads the lines of what the page shows."""
    console.billing_down(False)
    await console.deliver("evt_s1", amount=100)
    await console.deliver("evt_s2", amount=200)
    await console.deliver("evt_s3", amount=100, kind="invoice.created")
    await sign_in(page, console, "/console/messages")
    await page.get_by_label("Search").fill("evt_s2")
    await page.get_by_label("Search").press("Enter")
    await expect(page).to_have_url(console.url + "/console/messages?q=evt_s2")
    rows = page.locator("table.messages tbody tr")
    await expect(rows).to_have_count(1)
    await expect(rows).to_contain_text("evt_s2")
    await expect(page.get_by_label("Search")).to_have_value("evt_s2")

    await page.get_by_label("Search").fill("")
    await page.get_by_text("Advanced search").click()
    await page.get_by_label("Condition 1").fill("data.amount=100")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text("evt_s3")
    await expect(rows.nth(1)).to_contain_text("evt_s1")
    # The condition stays in its field (the disclosure open), with an empty one for the next.
    await expect(page.get_by_label("Condition 1")).to_have_value("data.amount=100")
    await expect(page.get_by_label("Condition 2")).to_have_value("")

    async with httpx.AsyncClient(base_url=console.url) as client:
        refused = await client.get(
            "/admin/messages", params={"where": "data..amount=1"}, headers=AUTH
        )
    assert refused.status_code == 422
    words = refused.json()["detail"].split(": ", 1)[1]
    await page.get_by_label("Condition 2").fill("data..amount=1")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.get_by_role("alert")).to_contain_text(words)
    await expect(rows).to_have_count(0)
    await expect(page.get_by_label("Condition 2")).to_have_value("data..amount=1")

    await page.get_by_label("Condition 2").fill("")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(2)
    async with page.expect_download() as downloading:
        await page.get_by_role("link", name="Export JSON lines").click()
    download = await downloading.value
    assert download.suggested_filename == "messages.jsonl"
    lines = Path(await download.path()).read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [m["message_id"] for m in exported] == ["evt_s3", "evt_s1"]
    assert all(m["payload"]["data"]["amount"] == 100 for m in exported)
