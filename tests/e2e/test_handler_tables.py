"""The handler examples run as written: docs/handlers.md's ledger (its own table made by its own
Alembic migrations through `webhook-inbox db-url`, a `send`, the handler's row) and, beside it,
the README's `orders_seen` handler on the example's `demo` source, its table made by the
README's statement; and docs/cli.md's way to run SQL without psql."""

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
from tests.pg import psql
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


def fenced(page: str, heading: str) -> list[str]:
    """The fenced blocks of `page`'s section under `## heading`, in order."""
    text = (ROOT / page).read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```\w+\n(.*?)^```$", section, re.M | re.S)


def readme_blocks() -> tuple[str, str, str]:
    """The README's handler module, the line it adds to the `demo` source, and the statement
    that creates its table."""
    (handler, line, create) = fenced("README.md", "A handler")
    return handler, line, create


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


def test_the_handler_examples_run_as_documented(embedded_home: Path) -> None:
    tmp_path = embedded_home  # the embedded PostgreSQL runs as another user: see the fixture
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
    readme_handler, readme_line, readme_table = readme_blocks()
    # "# myapp/orders.py, importable from the directory you start webhook-inbox in"
    (tmp_path / readme_handler.splitlines()[0].removeprefix("# ").split(",")[0]).write_text(
        readme_handler
    )
    # "Copy inbox.example.toml to inbox.toml and add one line to its [sources.demo] table
    # (above [sources.demo.hmac])"; then the ledger's source.
    example = (ROOT / "inbox.example.toml").read_text()
    assert example.count("[sources.demo.hmac]") == 1
    example = example.replace("[sources.demo.hmac]", readme_line + "\n[sources.demo.hmac]")
    (tmp_path / "inbox.toml").write_text(example + "\n" + config[1])
    data_dir = tmp_path / ".inbox"
    env = {
        **os.environ,
        "INBOX_DATA_DIR": str(data_dir),
        "STRIPE_WEBHOOK_SECRET": SECRET,
        "DEMO_WEBHOOK_SECRET": "demo-local-secret",  # as `make run` sets it
        "INBOX_LOG_LEVEL": "WARNING",
    }

    with ServerProcess(
        {
            "INBOX_DATA_DIR": str(data_dir),
            "STRIPE_WEBHOOK_SECRET": SECRET,
            "DEMO_WEBHOOK_SECRET": "demo-local-secret",
        },
        tmp_path,
        startup_timeout=90,
    ) as server:
        env["INBOX_PORT"] = str(server.port)  # the documented `send` uses the default address
        shell(init[1], tmp_path, env)
        env_py = tmp_path / "myapp" / "migrations" / "env.py"
        text = env_py.read_text()
        # "add `import os` to the imports at its top and the two lines after `config =
        # context.config` below, and add `version_table=VERSION_TABLE,` to both
        # `context.configure(` calls"
        assert text.count("config = context.config\n") == 1
        assert text.count("context.configure(") == 2
        imports, _, added = env_lines[1].partition("config = context.config\n")
        assert imports.startswith("import os\n")
        text = "import os\n" + text.replace(
            "config = context.config\n", f"config = context.config\n{added}"
        )
        text = text.replace("context.configure(", "context.configure(version_table=VERSION_TABLE,")
        env_py.write_text(text)
        path = tmp_path / migration[1].splitlines()[0].removeprefix("# ")
        path.write_text(migration[1])

        shell(upgrade[1], tmp_path, env)
        shell(readme_table, tmp_path, env)
        sent = shell(try_it[1], tmp_path, env)
        assert '"status":"accepted"' in sent
        url = shell(".venv/bin/webhook-inbox db-url", tmp_path, env).strip()
        rows = asyncio.run(rows_when_written(url, LEDGER))
        assert rows == [("ch_1", 1250, "eur")]
        # The embedded server's URL (its Unix socket) pasted into psql, as docs/cli.md says,
        # and into its statement for a machine without psql.
        assert psql(url, "SELECT charge_id FROM ledger_entries") == "ch_1"
        (without_psql,) = fenced("docs/cli.md", "db-url")
        rows = shell(without_psql, tmp_path, env).splitlines()
        assert "<Record source='payments' status='processed' count=1>" in rows, rows

        demo = shell(".venv/bin/webhook-inbox send demo --id ord_1", tmp_path, env)
        assert '"status":"accepted"' in demo
        assert asyncio.run(rows_when_written(url, ORDERS)) == [("ord_1", "test.event")]

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
    assert (
        asyncio.run(table_rows(url, LEDGER, wait=False)) is None
    )  # the embedded server went with serve


LEDGER = "SELECT charge_id, amount, currency FROM ledger_entries"
ORDERS = "SELECT order_id, kind FROM orders_seen"


async def rows_when_written(url: str, query: str) -> list[tuple[object, ...]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = await table_rows(url, query)
        if rows:
            return rows
        await asyncio.sleep(0.2)
    raise AssertionError(f"the handler's row never appeared: {query}")


async def table_rows(url: str, query: str, wait: bool = True) -> list[tuple[object, ...]] | None:
    try:
        conn = await asyncpg.connect(url, timeout=5)
    except OSError:
        if wait:
            raise
        return None
    try:
        return [tuple(r.values()) for r in await conn.fetch(query)]
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
