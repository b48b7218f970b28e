"""The command line as a real process: a bad configuration stops `serve` with one line; two
`migrate`s at once; a schema newer than the release, or none; help; `--version`;
`send` (every kind, most of them run in this process) and `messages` against a running
`serve`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from service.core.db import asyncpg_dsn, describe_url
from service.core.migrations import MIGRATION_LOCK, head_revision
from tests.cli_runner import Ran, run_cli
from tests.pg import LOCK_WAITERS, create_database, drop_database, with_database
from tests.processing_helpers import wait_until
from tests.send_sources import SENDABLE, SOURCES_TOML
from tests.server import ServerProcess


def serve_refusing(config: Path, **env: str) -> str:
    """Start `serve` with INBOX_CONFIG=`config`; return the one line it exits with (status 1)."""
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve"],
        env={
            "INBOX_CONFIG": str(config),
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": "postgresql://x",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


def test_serve_refuses_a_bad_config_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inbox.toml"
    path.write_text('[sources.pay]\nkind = "generic"\nid_header = "x"\nmax_attempts = 0\n')
    line = serve_refusing(path)
    assert line.startswith(f"config error: {path}: sources.pay.max_attempts:")


def test_serve_refuses_an_alert_webhook_it_cannot_post_to_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inbox.toml"
    url = "https://hooks slack.com/services/T0/B0/secret-part"
    path.write_text('[alerts]\nwebhooks = ["http://127.0.0.1:9/ok", "env:SLACK_WEBHOOK_URL"]\n')
    line = serve_refusing(path, SLACK_WEBHOOK_URL=url)
    assert line == (
        f"config error: {path}: alerts.webhooks[1]: an alert webhook URL cannot contain spaces "
        "or control characters"
    )


def test_serve_refuses_a_handler_that_does_not_import_with_one_line(tmp_path: Path) -> None:
    # The supervisor imports no handler module: a child forked to check them says this.
    path = tmp_path / "inbox.toml"
    path.write_text(
        '[sources.pay]\nkind = "generic"\nid_header = "x"\nhandlers = ["no_such_module:go"]\n'
    )
    assert serve_refusing(path) == (
        f"config error: {path}: sources.pay.handlers[0]: cannot import module "
        "'no_such_module': ModuleNotFoundError: No module named 'no_such_module'"
    )


def test_serve_refuses_a_tracing_protocol_it_cannot_export_with_one_line(tmp_path: Path) -> None:
    # The supervisor traces nothing itself: the checking child reads OTEL_* as children would.
    path = tmp_path / "inbox.toml"
    path.write_text("")
    line = serve_refusing(
        path, OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="http/json"
    )
    assert line.startswith("config error: OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' is not")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("inbox.tml", "no such file (INBOX_CONFIG names it"),
        ("a-directory", "is a directory, not a TOML file"),
    ],
)
def test_serve_refuses_a_config_path_that_names_no_file_with_one_line(
    tmp_path: Path, name: str, expected: str
) -> None:
    (tmp_path / "a-directory").mkdir()
    path = tmp_path / name
    assert serve_refusing(path).startswith(f"config error: {path}: {expected}")


@pytest.mark.parametrize("command", [["migrate"], ["prune"], ["serve", "--no-worker"]])
def test_an_unreachable_database_stops_the_command_with_one_line_and_status_3(
    command: list[str], tmp_path: Path
) -> None:
    (tmp_path / "inbox.toml").write_text("")
    url = "postgresql://inbox:s3cret-pw@127.0.0.1:1/inbox"  # nothing listens on port 1
    ran = webhook_inbox(*command, env={"DATABASE_URL": url}, cwd=tmp_path)
    assert ran.status == 3, ran.err
    (line,) = ran.err.strip().splitlines()  # no traceback
    assert line.startswith(
        f"webhook-inbox {command[0]}: database postgresql://inbox:***@127.0.0.1:1/inbox "
        "is unavailable: ConnectionRefusedError"
    )


def test_a_database_that_refuses_the_login_stops_migrate_with_one_line(
    pg_server: str, tmp_path: Path
) -> None:
    url = with_database(pg_server, "no_such_database")
    ran = webhook_inbox("migrate", env={"DATABASE_URL": url}, cwd=tmp_path)
    assert ran.status == 3, ran.err
    (line,) = ran.err.strip().splitlines()
    assert line.endswith('is unavailable: database "no_such_database" does not exist')


async def test_two_migrates_started_together_on_a_new_database_both_succeed(
    pg_server: str, tmp_path: Path
) -> None:
    # As replicas started together do. Both are held at the migration lock until both wait
    # there, so they do run at once; without the lock, the second failed on a duplicate
    # type of the first's new tables (4 runs out of 4).
    name = await create_database(pg_server)
    url = with_database(pg_server, name)
    holder = await asyncpg.connect(asyncpg_dsn(url))
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        command = [str(Path(sys.executable).parent / "webhook-inbox"), "migrate"]
        env = {**os.environ, "DATABASE_URL": url, "INBOX_LOG_LEVEL": "WARNING"}
        migrates = [
            subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        try:
            await wait_until(holder, LOCK_WAITERS, 2, timeout=60)
        finally:
            await held.rollback()
        outputs = [process.communicate(timeout=60)[0] for process in migrates]
        assert [process.returncode for process in migrates] == [0, 0], outputs
        assert outputs == [f"migrated {describe_url(url)} to head\n"] * 2
        versions = await holder.fetch("SELECT version_num FROM alembic_version")
        assert [v["version_num"] for v in versions] == [head_revision()]
    finally:
        await holder.close()
        await drop_database(pg_server, name)


@pytest.mark.parametrize("command", ["worker", "prune"])
async def test_a_command_started_before_migrate_stops_with_one_line(
    command: str, pg_server: str, tmp_path: Path
) -> None:
    name = await create_database(pg_server)  # empty: no migration has run
    url = with_database(pg_server, name)
    try:
        (tmp_path / "inbox.toml").write_text("")
        ran = webhook_inbox(command, env={"DATABASE_URL": url}, cwd=tmp_path)
        assert ran.status == 3, ran.err
        (line,) = ran.err.strip().splitlines()  # no traceback
        assert line == (
            f"webhook-inbox {command}: database {describe_url(url)} has no inbox tables: run "
            "`webhook-inbox migrate`"
        )
    finally:
        await drop_database(pg_server, name)


@pytest.mark.parametrize("command", [["migrate"], ["serve", "--no-worker"]])
async def test_a_database_migrated_by_a_newer_release_stops_the_command_with_one_line(
    command: list[str], database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    # A rollback: the release that migrated the database past this one's head is gone.
    await db.execute("UPDATE alembic_version SET version_num = '9001_from_the_future'")
    (tmp_path / "inbox.toml").write_text("")
    ran = webhook_inbox(*command, env={"DATABASE_URL": database_url}, cwd=tmp_path)
    assert ran.status == 3, ran.err
    (line,) = ran.err.strip().splitlines()  # no traceback
    assert line == (
        f"webhook-inbox {command[0]}: the database's schema is at revision "
        f"9001_from_the_future, which this release does not know (its newest is "
        f"{head_revision()}): a newer release migrated it; run that release, or downgrade the "
        "schema with it first"
    )
    assert await db.fetchval("SELECT version_num FROM alembic_version") == "9001_from_the_future"


@pytest.mark.parametrize("command", [[], ["serve"], ["migrate"]])
def test_help(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "DATABASE_URL" in result.stdout


def webhook_inbox(*args: str, env: dict[str, str], cwd: Path | None = None) -> Ran:
    """The installed `webhook-inbox` command, as a shell runs it."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "webhook-inbox"), *args],
        env={**os.environ, "INBOX_LOG_LEVEL": "WARNING", **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Ran(result.returncode, result.stdout, result.stderr)


def test_version() -> None:
    ran = webhook_inbox("--version", env={})
    assert ran.status == 0
    assert ran.out.strip() == f"webhook-inbox {importlib.metadata.version('webhook-inbox')}"


@pytest.mark.slow
def test_send_to_a_running_serve_for_every_kind_then_see_them_listed(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "inbox.toml"
    config.write_text(SOURCES_TOML)
    env = {"INBOX_CONFIG": str(config), "DATABASE_URL": database_url}
    with ServerProcess(env, tmp_path) as server:
        env["INBOX_PORT"] = str(server.port)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        # Each kind's `send` runs in this process (a process start apiece would cost seconds);
        # the installed command, as a shell runs it, sends the duplicate and lists them all.
        for name in SENDABLE:
            sent = run_cli("send", name, "--id", f"e2e-{name}")
            assert sent.status == 0, (name, sent.err)
            assert "accepted" in sent.out, (name, sent.out)
        again = webhook_inbox("send", "stripe", "--id", "e2e-stripe", env=env)
        assert (again.status, json.loads(again.out)["status"]) == (0, "duplicate")

        unknown = run_cli("send", "nobody")
        assert unknown.status == 2
        assert "no source 'nobody'" in unknown.err
        unsignable = run_cli("send", "sns")
        assert unsignable.status == 2
        assert "only AWS" in unsignable.err

        listed = webhook_inbox("messages", "list", "--limit", "500", "--json", env=env)
        assert listed.status == 0, listed.err
        sources = {m["source"] for m in listed.json()["items"]}
        assert sources == set(SENDABLE)
    gone = run_cli("send", "stripe")
    assert gone.status == 3
    assert "is `webhook-inbox serve` running?" in gone.err
