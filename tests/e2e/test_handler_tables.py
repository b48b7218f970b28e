"""docs/handlers.md's ledger example, run as written: the handler's own table made by its own
Alembic migrations through `webhook-inbox db-url`, a `send`, and the handler's row."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest

from service.core.migrations import head_revision
from tests.server import ServerProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_handler_tables_0123456789"


def example_blocks() -> list[tuple[str, str]]:
    """The fenced blocks of the ledger example, as (language, text), in order."""
    page = (ROOT / "docs" / "handlers.md").read_text()
    section = page.split("## A complete example: a ledger\n", 1)[1].split("\n## ", 1)[0]
    return [
        (lang, text) for lang, text in re.findall(r"^```(\w+)\n(.*?)^```$", section, re.M | re.S)
    ]


def shell(script: str, cwd: Path, env: dict[str, str]) -> str:
    """Run pasted lines with bash, as a user would; their output (failing on any error)."""
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{script}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_ledger_example_runs_as_documented(tmp_path: Path) -> None:
    (init, env_lines, migration, upgrade, handler, config, try_it) = example_blocks()
    assert [init[0], env_lines[0], migration[0], upgrade[0], handler[0], config[0], try_it[0]] == [
        "sh",
        "python",
        "python",
        "sh",
        "python",
        "toml",
        "sh",
    ]
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # where `make run` installed everything
    handler_path = tmp_path / handler[1].splitlines()[0].removeprefix("# ")
    handler_path.parent.mkdir()
    handler_path.write_text(handler[1])
    (tmp_path / "inbox.toml").write_text(config[1])
    data_dir = tmp_path / ".inbox"
    env = {
        **os.environ,
        "INBOX_DATA_DIR": str(data_dir),
        "STRIPE_WEBHOOK_SECRET": SECRET,
        "INBOX_LOG_LEVEL": "WARNING",
    }

    with ServerProcess(
        {"INBOX_DATA_DIR": str(data_dir), "STRIPE_WEBHOOK_SECRET": SECRET},
        tmp_path,
        startup_timeout=90,
    ) as server:
        env["INBOX_PORT"] = str(server.port)  # the documented `send` uses the default address
        shell(init[1], tmp_path, env)
        env_py = tmp_path / "myapp" / "migrations" / "env.py"
        text = env_py.read_text()
        # "right after `config = context.config`, add the lines below, and add
        # `version_table=VERSION_TABLE,` to both `context.configure(` calls"
        assert text.count("config = context.config\n") == 1
        assert text.count("context.configure(") == 2
        text = text.replace(
            "config = context.config\n", f"config = context.config\n\n{env_lines[1]}"
        )
        text = text.replace("context.configure(", "context.configure(version_table=VERSION_TABLE,")
        env_py.write_text(text)
        path = tmp_path / migration[1].splitlines()[0].removeprefix("# ")
        path.write_text(migration[1])

        shell(upgrade[1], tmp_path, env)
        sent = shell(try_it[1], tmp_path, env)
        assert '"status":"accepted"' in sent
        url = shell(".venv/bin/webhook-inbox db-url --plain", tmp_path, env).strip()
        rows = asyncio.run(ledger_when_processed(url))
        assert rows == [("ch_1", 1250, "eur")]

        again = shell(
            ".venv/bin/webhook-inbox send payments --id evt_1 --event-type charge.succeeded "
            "--file charge.json",
            tmp_path,
            env,
        )
        assert '"status":"duplicate"' in again
        # The console script (not `python -m`, which would put the directory on sys.path
        # itself) imports myapp.billing from the working directory, as the page says.
        pruned = shell(".venv/bin/webhook-inbox prune", tmp_path, env)
        assert pruned.startswith("pruned 0 rows")
        versions = asyncio.run(versions_of(url))
        assert versions == {
            "myapp_alembic_version": "myapp_0001",
            "alembic_version": head_revision(),  # the inbox's own, untouched
        }
    assert asyncio.run(ledger_rows(url, wait=False)) is None  # the embedded server went with serve


async def ledger_when_processed(url: str) -> list[tuple[str, int, str]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = await ledger_rows(url)
        if rows:
            return rows
        await asyncio.sleep(0.2)
    raise AssertionError("the handler's row never appeared")


async def ledger_rows(url: str, wait: bool = True) -> list[tuple[str, int, str]] | None:
    try:
        conn = await asyncpg.connect(url, timeout=5)
    except OSError:
        if wait:
            raise
        return None
    try:
        records = await conn.fetch("SELECT charge_id, amount, currency FROM ledger_entries")
        return [(r["charge_id"], r["amount"], r["currency"]) for r in records]
    finally:
        await conn.close()


async def versions_of(url: str) -> dict[str, str]:
    conn = await asyncpg.connect(url)
    try:
        return {
            table: await conn.fetchval(f"SELECT version_num FROM {table}")
            for table in ("myapp_alembic_version", "alembic_version")
        }
    finally:
        await conn.close()
