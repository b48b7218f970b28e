"""Fixtures of the integration tests beyond those of every layer (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.core.settings import Settings
from tests.conftest import running
from tests.deliveries import inbox


@pytest.fixture
async def every_kind(database_url: str, data_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app serving a source of every kind (`tests.deliveries.SOURCES`) on the
    test's database."""
    app = create_app(Settings(database_url=database_url, data_dir=data_dir), inbox())
    async with running(app) as client:
        yield client
