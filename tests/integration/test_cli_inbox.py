"""`messages`, `dead-letters` and `stats` from the shell: the admin API's answers, exit codes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.admin_seed import AUTH, CONFIG, TOKEN, seed, seed_attempt, status_of
from tests.cli_runner import cli, refused_at_start, run_cli
from tests.conftest import AppFactory
from tests.console_helpers import sign_in
from tests.pg import create_database, drop_database, with_database


def admin_client(client_for: AppFactory) -> Any:
    return client_for(CONFIG, admin_tokens=[TOKEN])


async def test_list_show_and_stats_answer_what_the_admin_api_answers(
    client_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = await seed(db, "m-dead", status="dead", attempts=3, last_error="handler failed")
    await seed_attempt(db, dead, 1, "failed", error="handler failed")
    await seed(db, "m-ok", status="processed", event_type="order.created")
    await seed(db, "m-other", source="other")

    listed = await cli(monkeypatch, database_url, "messages", "list", "--json")
    shown = await cli(monkeypatch, database_url, "messages", "show", str(dead), "--json")
    dead_letters = await cli(monkeypatch, database_url, "dead-letters", "--json")
    stats = await cli(monkeypatch, database_url, "stats", "--json")
    groups = await cli(monkeypatch, database_url, "dead-letters", "--groups", "--json")
    groups_table = await cli(monkeypatch, database_url, "dead-letters", "--groups")
    async with admin_client(client_for) as client:
        api_list = (await client.get("/admin/messages", headers=AUTH)).json()
        api_detail = (await client.get(f"/admin/messages/{dead}", headers=AUTH)).json()
        api_dead = (await client.get("/admin/dead-letters", headers=AUTH)).json()
        api_stats = (await client.get("/admin/stats", headers=AUTH)).json()
        api_groups = (await client.get("/admin/dead-letters/groups", headers=AUTH)).json()

    assert (listed.status, shown.status, dead_letters.status, stats.status) == (0, 0, 0, 0)
    assert listed.json() == api_list
    assert shown.json() == api_detail
    assert dead_letters.json() == api_dead
    assert [m["message_id"] for m in dead_letters.json()["items"]] == ["m-dead"]
    assert without_ages(stats.json()) == without_ages(api_stats)
    assert groups.json() == api_groups
    assert groups.json()["groups"][0]["error_type"] == "RuntimeError"
    assert groups_table.out.splitlines()[1].split()[:3] == ["RuntimeError", "1", "hooks"]


def without_ages(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats without the backlog's ages, which grow between two reads."""
    stats.pop("oldest_pending_age_seconds")
    for source in stats["sources"]:
        assert (source.pop("oldest_pending_age_seconds") is None) == (
            "pending" not in source["counts"]
        )
    return stats


async def test_only_a_message_still_to_be_tried_has_a_next_attempt(
    client_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    statuses = ["pending", "retrying", "processed", "dead", "discarded"]
    ids = {status: await seed(db, f"m-{status}", status=status) for status in statuses}
    async with admin_client(client_for) as client:
        listed = (await client.get("/admin/messages", headers=AUTH)).json()["items"]
        details = {
            status: (await client.get(f"/admin/messages/{id_}", headers=AUTH)).json()
            for status, id_ in ids.items()
        }
    due = {m["status"] for m in listed if m["next_attempt_at"] is not None}
    assert due == {"pending", "retrying"}
    assert {s for s, d in details.items() if d["next_attempt_at"] is not None} == due
    for status in ("dead", "processed"):
        shown = await cli(monkeypatch, database_url, "messages", "show", str(ids[status]))
        assert "next attempt: -\n" in shown.out, shown.out
    retrying = await cli(monkeypatch, database_url, "messages", "show", str(ids["retrying"]))
    assert "next attempt: -\n" not in retrying.out


async def test_after_an_operator_retry_both_attempt_counts_are_shown_and_named(
    client_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = await seed(db, "m-dead", status="dead", attempts=5, last_error="handler failed")
    fresh = await seed(db, "m-fresh", status="retrying", attempts=2)
    async with admin_client(client_for) as client:
        retried = (await client.post(f"/admin/messages/{dead}/retry", headers=AUTH)).json()
        # One more attempt, after the retry: the history's #6, the new budget's first.
        await db.execute("UPDATE inbox_messages SET attempts = 6 WHERE id = $1", dead)
        listed = (await client.get("/admin/messages", headers=AUTH)).json()["items"]
        shown = (await client.get(f"/admin/messages/{dead}", headers=AUTH)).json()
        await sign_in(client)
        page = (await client.get(f"/console/messages/{dead}")).text
        console_list = (await client.get("/console/messages")).text
    counts = ("attempt_count", "attempt_count_total")
    assert [retried[k] for k in counts] == [0, 5]
    assert {m["message_id"]: [m[k] for k in counts] for m in listed} == {
        "m-dead": [1, 6],
        "m-fresh": [2, 2],
    }
    assert [shown[k] for k in counts] == [1, 6]
    table = await cli(monkeypatch, database_url, "messages", "list")
    detail = await cli(monkeypatch, database_url, "messages", "show", str(dead))
    untouched = await cli(monkeypatch, database_url, "messages", "show", str(fresh))
    both = "1 since retry, 6 in all"
    assert both in table.out
    assert f"attempts:     {both}\n" in detail.out
    assert "attempts:     2\n" in untouched.out
    assert both in page
    assert both in console_list


async def test_after_an_operator_retry_a_destination_shows_both_attempt_counts(
    client_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = await seed(db, "m-routed", source="routed", status="retrying", attempts=6)
    await db.execute(
        "INSERT INTO inbox_destinations (message_id, destination, source, status, attempts, "
        "budget_start) "
        "VALUES ($1, 'billing', 'routed', 'retrying', 4, 3), "
        "($1, 'warehouse', 'routed', 'retrying', 2, 1)",
        message,
    )
    # billing: 3 failed, retried on its own, 1 failed; warehouse: 1 failed, the whole message
    # retried (which ran its unfinished destinations again), 1 failed. Each retry started the
    # destination's budget at its attempts then (`budget_start`).
    history = [
        ("failed", "billing"),
        ("failed", "warehouse"),
        ("failed", "billing"),
        ("admin_retry", None),
        ("failed", "billing"),
        ("failed", "warehouse"),
        ("admin_retry", "billing"),
        ("failed", "billing"),
    ]
    for n, (outcome, destination) in enumerate(history, 1):
        await db.execute(
            "INSERT INTO inbox_attempts (message_id, attempt, started_at, outcome, destination) "
            "VALUES ($1, $2, now() - make_interval(secs => 10 - $2), $3, $4)",
            message,
            n,
            outcome,
            destination,
        )
    async with admin_client(client_for) as client:
        shown = (await client.get(f"/admin/messages/{message}", headers=AUTH)).json()
        await sign_in(client)
        page = (await client.get(f"/console/messages/{message}")).text
    counts = {
        d["name"]: (d["attempt_count"], d["attempt_count_total"]) for d in shown["destinations"]
    }
    assert counts == {"billing": (1, 4), "warehouse": (1, 2)}
    detail = await cli(monkeypatch, database_url, "messages", "show", str(message))
    for text in (detail.out, page):
        assert "1 since retry, 4 in all" in text
        assert "1 since retry, 2 in all" in text


async def test_a_message_held_by_its_ordering_key_says_so_in_the_lists_and_can_be_picked(
    client_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = {
        name: await seed(db, name, status=status, ordering_key=key)
        for name, status, key in [
            ("a-done", "processed", "a"),
            ("a-1", "dead", "a"),
            ("a-2", "pending", "a"),
            ("b-1", "pending", "b"),
            ("a-3", "retrying", "a"),
            ("none", "pending", None),
        ]
    }
    async with admin_client(client_for) as client:

        async def listed(query: str) -> dict[str, Any]:
            answer = await client.get(f"/admin/messages?{query}", headers=AUTH)
            assert answer.status_code == 200, answer.text
            return {m["message_id"]: m["held_behind"] for m in answer.json()["items"]}

        everything = (await client.get("/admin/messages", headers=AUTH)).json()["items"]
        held = await listed("held=true")
        key_a = await listed("ordering_key=a")
        key_a_free = await listed("ordering_key=a&held=false")
    assert {m["message_id"]: (m["ordering_key"], m["held_behind"]) for m in everything} == {
        "a-done": ("a", None),
        "a-1": ("a", None),
        "a-2": ("a", ids["a-1"]),
        "b-1": ("b", None),
        "a-3": ("a", ids["a-1"]),
        "none": (None, None),
    }
    assert held == {"a-2": ids["a-1"], "a-3": ids["a-1"]}
    assert set(key_a) == {"a-done", "a-1", "a-2", "a-3"}
    assert set(key_a_free) == {"a-done", "a-1"}

    table = await cli(monkeypatch, database_url, "messages", "list")
    assert f"pending, held behind {ids['a-1']}" in table.out
    assert f"retrying, held behind {ids['a-1']}" in table.out
    only_held = await cli(monkeypatch, database_url, "messages", "list", "--held", "--json")
    assert sorted(m["message_id"] for m in only_held.json()["items"]) == ["a-2", "a-3"]
    key_b = await cli(
        monkeypatch, database_url, "messages", "list", "--ordering-key", "b", "--json"
    )
    assert [m["message_id"] for m in key_b.json()["items"]] == ["b-1"]


async def test_filters_and_paging(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(3):
        await seed(db, f"m-{n}", status="dead", event_type="charge.failed")
    await seed(db, "m-ok", status="processed", event_type="charge.succeeded")
    await seed(db, "m-other", source="other", status="dead")

    by_status = await cli(
        monkeypatch, database_url, "messages", "list", "--status", "processed", "--json"
    )
    assert [m["message_id"] for m in by_status.json()["items"]] == ["m-ok"]
    both = await cli(
        monkeypatch,
        database_url,
        *("messages", "list", "--status", "processed", "--status", "dead"),
        *("--source", "hooks", "--event-type", "charge.failed", "--json"),
    )
    assert sorted(m["message_id"] for m in both.json()["items"]) == ["m-0", "m-1", "m-2"]

    seen: list[str] = []
    cursor: list[str] = []
    while True:
        page = await cli(
            monkeypatch,
            database_url,
            "dead-letters",
            "--source",
            "hooks",
            "--limit",
            "2",
            "--json",
            *cursor,
        )
        assert page.status == 0, page.err
        seen += [m["message_id"] for m in page.json()["items"]]
        if page.json()["next_cursor"] is None:
            break
        cursor = ["--cursor", page.json()["next_cursor"]]
    assert sorted(seen) == ["m-0", "m-1", "m-2"]

    people = await cli(monkeypatch, database_url, "dead-letters", "--limit", "2")
    lines = people.out.splitlines()
    assert lines[0].split() == [
        "ID",
        "SOURCE",
        "MESSAGE",
        "ID",
        "EVENT",
        "TYPE",
        "STATUS",
        "ATTEMPTS",
        "RECEIVED",
        "ERROR",
    ]
    assert len(lines) == 4  # header, two rows, and where the next page starts
    assert lines[-1].startswith("next: --cursor '")
    nothing = await cli(monkeypatch, database_url, "messages", "list", "--source", "nobody")
    assert (nothing.status, nothing.out.strip()) == (0, "no messages match")


async def test_retry_replay_discard_and_their_refusals(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = await seed(db, "m-dead", status="dead", attempts=3)
    done = await seed(db, "m-done", status="processed")
    pending = await seed(db, "m-pending")

    retried = await cli(monkeypatch, database_url, "messages", "retry", str(dead))
    assert retried.status == 0, retried.err
    assert "admin_retry, now pending" in retried.out
    assert await status_of(db, dead) == "pending"
    actor = await db.fetchval(
        "SELECT actor FROM inbox_attempts WHERE message_id = $1 ORDER BY id DESC", dead
    )
    assert actor.startswith("cli:")

    refused = await cli(monkeypatch, database_url, "messages", "retry", str(done))
    assert refused.status == 1
    assert "is processed" in refused.err
    assert "`replay`" in refused.err
    replayed = await cli(monkeypatch, database_url, "messages", "replay", str(done), "--json")
    assert (replayed.status, replayed.json()["action"]) == (0, "admin_replay")

    discarded = await cli(monkeypatch, database_url, "messages", "discard", str(pending))
    assert discarded.status == 0
    assert await status_of(db, pending) == "discarded"
    again = await cli(monkeypatch, database_url, "messages", "discard", str(pending))
    assert again.status == 0
    assert "already discarded" in again.out

    missing = await cli(monkeypatch, database_url, "messages", "show", "999999")
    assert missing.status == 1
    assert "no message with id 999999" in missing.err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["messages", "list", "--since", "yesterday"], "--received-after"),
        (["messages", "list", "--limit", "501"], "--limit"),
        (["messages", "list", "--cursor", "nonsense"], "--cursor 'nonsense' is not a position"),
        (["messages", "list", "--status", "done"], "invalid choice: 'done'"),
        (["messages", "show", "abc"], "'abc' is not an inbox id"),
        (["messages"], "required: ACTION"),
    ],
)
async def test_usage_errors_exit_2_with_one_line(
    args: list[str], expected: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = await cli(monkeypatch, database_url, *args)
    assert ran.status == 2
    assert expected in ran.err


async def test_no_database_exits_3_and_says_where_it_looked(
    pg_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("INBOX_DATA_DIR", str(tmp_path / "nowhere"))
    ran = await asyncio.to_thread(run_cli, "stats")
    assert ran.status == 3
    assert f"{tmp_path / 'nowhere' / 'pgdata'} holds no embedded PostgreSQL" in ran.err
    assert not (tmp_path / "nowhere").exists()  # nothing was created

    closed = await cli(monkeypatch, "postgresql://nobody@127.0.0.1:1/inbox", "stats")
    assert closed.status == 3
    assert "is unavailable" in closed.err

    empty = await create_database(pg_server)
    try:
        bare = await cli(monkeypatch, with_database(pg_server, empty), "messages", "list")
    finally:
        await drop_database(pg_server, empty)
    assert bare.status == 3
    assert "run `webhook-inbox migrate`" in bare.err


async def test_bulk_retry_counts_first_then_retries_what_the_filters_match(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = [await seed(db, f"m-dead-{n}", status="dead") for n in range(3)]
    other = await seed(db, "m-other", source="other", status="dead")
    done = await seed(db, "m-done", status="processed")

    counted = await cli(
        monkeypatch, database_url, "messages", "bulk-retry", "--source", "hooks", "--dry-run"
    )
    assert (counted.status, counted.out.split()[0]) == (0, "3")
    assert {await status_of(db, m) for m in dead} == {"dead"}

    retried = await cli(
        monkeypatch, database_url, "messages", "bulk-retry", "--source", "hooks", "--json"
    )
    assert (retried.status, retried.json()) == (0, {"matched": 3, "retried": 3})
    assert {await status_of(db, m) for m in dead} == {"pending"}
    assert await status_of(db, other) == "dead"
    assert await status_of(db, done) == "processed"  # a replay must be named and forced

    replayed = await cli(
        monkeypatch,
        database_url,
        *("messages", "bulk-retry", "--status", "processed", "--force", "--json"),
    )
    assert replayed.json() == {"matched": 1, "retried": 1}
    assert await status_of(db, done) == "pending"


# Two sources with `env:` secrets; only the one the test sets is resolvable.
TWO_SECRETS = """
sources.orders = { kind = "github", secrets = ["env:ORDERS_SECRET"] }
sources.shop = { kind = "shopify", secrets = ["env:SHOP_SECRET"] }
"""


async def test_a_command_needs_only_the_secrets_of_the_source_it_verifies_or_signs_for(
    database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    toml = tmp_path / "inbox.toml"
    toml.write_text(TWO_SECRETS)
    monkeypatch.setenv("INBOX_CONFIG", str(toml))
    monkeypatch.setenv("ORDERS_SECRET", "orders-signing-secret")
    monkeypatch.delenv("SHOP_SECRET", raising=False)
    unset = "sources.shop.secrets[0]: environment variable SHOP_SECRET is not set"

    paused = await cli(monkeypatch, database_url, "pause", "orders", "--reason", "x")
    assert paused.status == 0, paused.err
    assert (await cli(monkeypatch, database_url, "resume", "shop")).status == 0
    assert (await cli(monkeypatch, database_url, "messages", "list")).status == 0
    assert (await cli(monkeypatch, database_url, "destinations")).status == 0
    assert (await cli(monkeypatch, database_url, "prune")).status == 0
    # `send orders` signs and posts (to nothing listening): past the config, with no word of shop.
    sent = await cli(monkeypatch, database_url, "send", "orders", "--url", "http://127.0.0.1:1")
    assert sent.status == 3, sent.err
    assert "no answer from http://127.0.0.1:1/webhooks/orders" in sent.err
    # The source signed for needs its secret, and serving needs every source's, before it starts.
    refused = await cli(monkeypatch, database_url, "send", "shop")
    assert refused.status == 2
    assert refused.err.strip().endswith(f"config error: {toml}: {unset}"), refused.err
    for command in ("serve", "worker"):
        stopped = refused_at_start(monkeypatch, toml, TWO_SECRETS, command)
        assert stopped == f"config error: {toml}: {unset}"


async def test_act_shows_its_id_and_progress_and_resumes_an_interrupted_action(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = [await seed(db, f"m-dead-{n}", status="dead") for n in range(5)]
    other = await seed(db, "m-other", source="other", status="dead")

    counted = await cli(
        monkeypatch, database_url, *("messages", "act", "discard", "--source", "hooks", "--dry-run")
    )
    assert (counted.status, counted.out.split()[0]) == (0, "5")
    assert await db.fetchval("SELECT count(*) FROM inbox_bulk_actions") == 0

    retried = await cli(
        monkeypatch,
        database_url,
        *("messages", "act", "retry", "--source", "hooks", "--batch-size", "2"),
    )
    lines = retried.out.splitlines()
    action_id = await db.fetchval("SELECT max(id) FROM inbox_bulk_actions")
    assert retried.status == 0, retried.err
    # The id first, to resume with; then a line per committed batch (stdout is no terminal).
    assert lines[0].startswith(f"bulk action {action_id}: retry of 5 messages")
    assert f"messages actions resume {action_id}" in lines[0]
    assert lines[1:5] == ["0/5 done", "2/5 done", "4/5 done", "5/5 done"]
    assert lines[5] == f"bulk action {action_id} finished: 5 of 5 changed"
    assert {await status_of(db, m) for m in dead} == {"pending"}
    assert await status_of(db, other) == "dead"

    # As Ctrl-C leaves a discard after its first batch of 2.
    await db.execute("UPDATE inbox_messages SET status = 'dead' WHERE source = 'hooks'")
    await db.execute("UPDATE inbox_messages SET status = 'discarded' WHERE id = ANY($1)", dead[:2])
    interrupted = await db.fetchval(
        "INSERT INTO inbox_bulk_actions (action, query, actor, status, matched, done, after_id,"
        " last_id) VALUES ('discard', '{\"source\": \"hooks\"}', 'cli:test', 'interrupted', 5,"
        " 2, $1, $2) RETURNING id",
        dead[1],
        dead[-1],
    )
    resumed = await cli(
        monkeypatch,
        database_url,
        *("messages", "actions", "resume", str(interrupted), "--batch-size", "2"),
    )
    assert resumed.status == 0, resumed.err
    assert resumed.out.splitlines()[1:] == [
        "2/5 done",
        "4/5 done",
        "5/5 done",
        f"bulk action {interrupted} finished: 5 of 5 changed",
    ]
    assert {await status_of(db, m) for m in dead} == {"discarded"}
    assert (
        await db.fetchval("SELECT count(*) FROM inbox_attempts WHERE outcome = 'admin_discard'")
        == 3
    )
    assert await status_of(db, other) == "dead"

    again = await cli(monkeypatch, database_url, "messages", "actions", "resume", str(interrupted))
    assert again.status == 1
    assert "finished" in again.err
    listed = await cli(monkeypatch, database_url, "messages", "actions", "--json")
    assert [a["id"] for a in listed.json()["items"]] == [interrupted, action_id]
    assert listed.json()["items"][0]["query"] == {"source": "hooks"}
    shown = await cli(monkeypatch, database_url, "messages", "actions", "show", str(action_id))
    assert shown.out.splitlines()[1].split()[:5] == [str(action_id), "retry", "finished", "5", "5"]
