"""docs/cli.md stays true: each `--help` it shows is what the command prints, and every
command has one."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from service.cli import build_parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
HELP_BLOCK = re.compile(r"^```\n\$ webhook-inbox (.*?)--help\n(.*?)^```$", re.M | re.S)


def documented() -> dict[str, str]:
    return {m.group(1).strip(): m.group(2) for m in HELP_BLOCK.finditer(PAGE.read_text())}


def printed_help(command: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")  # the width the page is written at
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*command.split(), "--help"])
    return out.getvalue()


def commands() -> list[str]:
    """Every command and subcommand the parser knows, as typed after `webhook-inbox`."""
    found = [""]
    pending = [("", build_parser())]
    while pending:
        prefix, parser = pending.pop()
        for action in parser._subparsers._group_actions if parser._subparsers else []:
            for name, sub in action.choices.items():  # type: ignore[union-attr]
                full = f"{prefix} {name}".strip()
                found.append(full)
                pending.append((full, sub))
    return sorted(found)


@pytest.mark.parametrize("command", commands())
def test_the_page_shows_each_commands_help_as_printed(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = documented()
    assert command in blocks, f"docs/cli.md shows no `webhook-inbox {command} --help`"
    assert blocks[command] == printed_help(command, monkeypatch)
