"""Unit tests run without a database: one that asks for PostgreSQL fails instead of starting it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pg_server() -> str:
    pytest.fail("a unit test uses no database: move it to tests/integration", pytrace=False)
