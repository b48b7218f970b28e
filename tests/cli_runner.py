"""Running `webhook-inbox` in this process, as a shell would, for the command-line tests."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.core import logging as service_logging


@dataclass(frozen=True)
class Ran:
    status: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """The process's logging as it was before: a command configures logging for a process of
    its own (root handlers on the stderr of the moment, the level, what records gather), which
    would outlive it here and go on writing to a stream pytest has closed since."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    flags = (logging._srcfile, logging.logThreads, logging.logMultiprocessing)
    installed = service_logging._installed
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging._srcfile, logging.logThreads, logging.logMultiprocessing = flags
        service_logging._installed = installed


def run_cli(*args: str) -> Ran:
    """`webhook-inbox ARGS` in this process: its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), logging_restored():
        try:
            main(list(args))
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
            if isinstance(exc.code, str):
                err.write(exc.code)
    return Ran(status, out.getvalue(), err.getvalue())


async def cli(monkeypatch: pytest.MonkeyPatch, database_url: str, *args: str) -> Ran:
    """The command against `database_url`, in a thread (it runs its own event loop)."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    return await asyncio.to_thread(run_cli, *args)


def refused_at_start(
    monkeypatch: pytest.MonkeyPatch, path: Path, sources_toml: str, *args: str
) -> str:
    """What `webhook-inbox ARGS` stops with on the sources file `sources_toml` (written to
    `path`): one it must refuse before it reaches the database, which nothing serves here."""
    path.write_text(sources_toml)
    monkeypatch.setenv("INBOX_CONFIG", str(path))
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(SystemExit) as stopped:
        main(list(args))
    return str(stopped.value.code)
