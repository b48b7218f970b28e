"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

from tests.pg import create_database, drop_database, empty_tables, scratch_dir, with_database
from tests.server import STARTED

# The last lines of a server's log that a failed test's report shows.
LOG_LINES_SHOWN = 80
_SETUP_STARTED = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_SETUP_STARTED] = time.monotonic()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with the log of every server it ran (started for it, or
    shared and still running): the server's side of a failure seen only as a client's error.
    The logs live in the test's temporary directory, which later pytest runs remove."""
    report = yield
    if report.failed and report.when in ("setup", "call"):
        since = item.stash.get(_SETUP_STARTED, float("inf"))
        for server in sorted(STARTED, key=lambda s: s.started_at):
            if server.started_at >= since or server.running():
                try:
                    tail = server.output().splitlines()[-LOG_LINES_SHOWN:]
                except OSError as exc:  # its directory is gone already
                    tail = [f"(log unreadable: {exc})"]
                report.sections.append((f"server log, port {server.port}", "\n".join(tail)))
    return report


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


async def emptied_module_database(module_database: str) -> str:
    """The `database_url` of a module whose tests share one server (and so `module_database`),
    emptied for each test; the module names it with
    `database_url = pytest.fixture(emptied_module_database, name="database_url")`."""
    await empty_tables(module_database)
    return module_database
