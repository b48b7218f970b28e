"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.pg import create_database, drop_database, scratch_dir, with_database


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """The work directory of a `serve` that starts its own embedded PostgreSQL.

    Not `tmp_path`: pytest makes its temporary root private to its user whenever any pytest
    session starts (another one on this machine included), and the embedded server runs as
    another user, which could then no longer reach its data directory.
    """
    home = scratch_dir("inbox-e2e-")
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
async def module_database(pg_server: str, template_db: str) -> AsyncIterator[str]:
    """One database for a module whose tests share one server process: starting `serve`
    costs seconds on a busy machine. Each test then starts from emptied tables
    (`tests.pg.empty_tables`)."""
    name = await create_database(pg_server, template=template_db)
    yield with_database(pg_server, name)
    await drop_database(pg_server, name)
