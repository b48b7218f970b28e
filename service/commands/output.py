"""What the operator commands print: aligned tables for people, the API's JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

# A cell longer than this is cut with an ellipsis, so that a long error keeps a row on one line.
MAX_CELL = 60


def print_json(document: BaseModel | dict[str, Any] | list[Any]) -> None:
    """One JSON document on stdout, shaped as the admin API answers the same question."""
    if isinstance(document, BaseModel):
        print(document.model_dump_json(indent=2))
    else:
        print(json.dumps(document, indent=2, default=str))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    text = " ".join(str(value).split())  # one line: a traceback or JSON never breaks the table
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, the header first."""
    cells = [list(headers), *([cell(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def age(seconds: float | None) -> str:
    """`3h12m`, `45s`: how long ago, to read at a glance."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


class Progress:
    """A long operation's progress on stdout: a bar redrawn in place on a terminal, else a
    line per step (a log or a pipe keeps every line, and no carriage returns)."""

    WIDTH = 30

    def __init__(self, total: int, done: int = 0) -> None:
        self.total = total
        self.on_terminal = sys.stdout.isatty()
        self.update(done)

    def update(self, done: int) -> None:
        share = done / self.total if self.total else 1.0
        if self.on_terminal:
            filled = round(share * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            print(f"\r[{bar}] {done}/{self.total} {share:.0%}", end="", flush=True)
        else:
            print(f"{done}/{self.total} done", flush=True)

    def close(self) -> None:
        if self.on_terminal:
            print()
