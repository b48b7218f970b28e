"""`webhook-inbox db-url` prints a URL an operator can paste into psql (psycopg takes the same
libpq form), whatever form DATABASE_URL was given in; `--sqlalchemy` the form Alembic takes."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from service.core.db import async_url
from tests.cli_runner import cli
from tests.pg import psql


async def test_the_printed_url_is_one_psql_connects_with(
    monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    # Given in SQLAlchemy's form, as a DATABASE_URL shared with an Alembic project may be.
    ran = await cli(monkeypatch, async_url(database_url), "db-url")
    assert ran.status == 0, ran.err
    url = ran.out.strip()
    assert url.startswith("postgresql://")
    assert psql(url, "SELECT current_database(), count(*) FROM inbox_messages") == (
        f"{urlsplit(database_url).path.lstrip('/')}|0"
    )


async def test_sqlalchemy_asks_for_the_asyncpg_form_and_plain_still_means_the_default(
    monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    sqlalchemy = await cli(monkeypatch, database_url, "db-url", "--sqlalchemy")
    assert sqlalchemy.out.strip() == async_url(database_url)
    plain = await cli(monkeypatch, database_url, "db-url", "--plain")
    default = await cli(monkeypatch, database_url, "db-url")
    assert plain.out == default.out == database_url.replace("postgres://", "postgresql://") + "\n"
