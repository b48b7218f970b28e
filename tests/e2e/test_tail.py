"""`webhook-inbox tail` as a real process beside a real `serve`: the lines it prints as
deliveries, duplicates and outcomes happen in the server's processes, and Ctrl-C ending it
with status 0."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import asyncpg
import httpx

from tests.processing_helpers import answered, create_effects, delivery
from tests.server import ServerProcess, serve_env
from tests.tail_scenario import EVERY_KIND
from tests.worker_process import ROOT

SOURCES_TOML = """
[sources.orders]
kind = "generic"
id_header = "x-message-id"
event_type_header = "x-event-type"
handlers = ["tests.handlers:record"]

[sources.flaky]
kind = "generic"
id_header = "x-message-id"
event_type_header = "x-event-type"
handlers = ["tests.handlers:always_fail"]
max_attempts = 2
backoff_base_seconds = 0.05
backoff_max_seconds = 0.1
"""
DEADLINE = 60.0  # seconds: a loaded machine starts processes slowly


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class TailProcess:
    """A running `webhook-inbox tail`, its lines read as they come."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service", "tail", *args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # As a terminal starts it: a suite run in the background of a non-interactive shell
            # has SIGINT ignored, the child would inherit that, and Ctrl-C would never reach it.
            preexec_fn=default_sigint,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._stdout: queue.Queue[str] = queue.Queue()
        self._stderr: queue.Queue[str] = queue.Queue()
        for stream, into in (
            (self.process.stdout, self._stdout),
            (self.process.stderr, self._stderr),
        ):
            assert stream is not None
            threading.Thread(target=self._pump, args=(stream, into), daemon=True).start()

    @staticmethod
    def _pump(stream: IO[str], into: queue.Queue[str]) -> None:
        for line in stream:
            into.put(line.rstrip("\n"))

    def wait_for(self, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"waited for {what}; out {self.lines}, err {self.errors}")
            for source, into in ((self._stdout, self.lines), (self._stderr, self.errors)):
                while True:
                    try:
                        into.append(source.get(timeout=0.05))
                    except queue.Empty:
                        break

    def following(self) -> None:
        self.wait_for(lambda: "following; Ctrl-C to stop" in self.errors, "`following`")

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=DEADLINE)


@contextmanager
def tailing(args: list[str], env: dict[str, str]) -> Iterator[TailProcess]:
    tail = TailProcess(args, env)
    try:
        yield tail
    finally:
        if tail.process.poll() is None:
            tail.process.kill()
            tail.process.wait()


def deliver(server: ServerProcess, source: str, message_id: str, event_type: str) -> str:
    url = f"{server.url}/webhooks/{source}"
    headers = delivery(message_id, event_type)
    return answered(httpx.post(url, content=b"{}", headers=headers, timeout=30))


async def test_tail_prints_each_event_as_it_happens_and_ctrl_c_ends_it_with_0(
    tmp_path: Path, database_url: str, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    env = serve_env(tmp_path, SOURCES_TOML, DATABASE_URL=database_url)
    tail_env = {**os.environ, **env, "INBOX_DATA_DIR": str(tmp_path / "data")}
    with (
        ServerProcess(env, tmp_path) as server,
        tailing(["--json"], tail_env) as everything,
        tailing(["flaky", "--status", "failed", "--status", "dead"], tail_env) as failures,
    ):
        everything.following()
        failures.following()
        assert deliver(server, "orders", "o-1", "order.created") == "accepted"
        assert deliver(server, "orders", "o-1", "order.created") == "duplicate"
        assert deliver(server, "flaky", "f-1", "payment.failed") == "accepted"

        expected = set(EVERY_KIND)

        def seen() -> set[tuple[str, str, str]]:
            events = [json.loads(line) for line in everything.lines]
            return {(e["kind"], e["source"], e["message_id"]) for e in events}

        everything.wait_for(lambda: expected <= seen(), f"{expected}")
        failures.wait_for(lambda: len(failures.lines) >= 2, "the failure and the dead letter")

        assert everything.interrupt() == 0
        assert failures.interrupt() == 0

    row = await db.fetchval("SELECT id FROM inbox_messages WHERE message_id = 'f-1'")
    failed, dead = failures.lines
    for line, what in ((failed, "failed (attempt 1)"), (dead, "dead (attempt 2)")):
        fields = line.split("  ")
        assert fields[1:] == [
            "flaky",
            f"#{row}",
            "f-1",
            "payment.failed",
            what,
            "ValueError: downstream says no",
        ], line
    assert not any("Traceback" in line for line in everything.errors + failures.errors)
