"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import scratch_dir


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
