"""The command line as a real process: a bad configuration stops `serve` with one line; help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def serve_refusing(config: Path) -> str:
    """Start `serve` with INBOX_CONFIG=`config`; return the one line it exits with."""
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve"],
        env={
            "INBOX_CONFIG": str(config),
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": "postgresql://x",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    return line


def test_serve_refuses_a_bad_config_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inbox.toml"
    path.write_text('[sources.pay]\nkind = "generic"\nid_header = "x"\nmax_attempts = 0\n')
    line = serve_refusing(path)
    assert line.startswith(f"config error: {path}: sources.pay.max_attempts:")


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
