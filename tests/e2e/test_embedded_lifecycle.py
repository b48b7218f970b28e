"""The embedded PostgreSQL lives exactly as long as `serve`, even after a killed run."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def postgres_of(pgdata: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "postgres" and str(pgdata) in " ".join(
            process.info["cmdline"] or []
        ):
            found.append(process)
    return found


def serve(home: Path) -> ServerProcess:
    # The embedded server is the supervising process's own; a processing process would only
    # add its start-up (tests/e2e/test_isolation.py drains both roles, then checks the same).
    args = ["serve", "--no-worker", "--port", "{port}"]
    return ServerProcess({"INBOX_LOG_LEVEL": "INFO"}, home, args=args)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_serve_stops_its_embedded_postgres_on_a_stop_signal(
    embedded_home: Path, stop_signal: signal.Signals
) -> None:
    pgdata = (embedded_home / "data" / "pgdata").resolve()
    with serve(embedded_home) as server:
        assert postgres_of(pgdata)
        assert server.process is not None
        server.process.send_signal(stop_signal)
        assert server.process.wait(60) == 0
    assert postgres_of(pgdata) == []
    assert json.loads((pgdata / ".handle_pids.json").read_text()) == []


def test_a_postgres_left_by_a_killed_serve_is_reused_then_stopped(embedded_home: Path) -> None:
    pgdata = (embedded_home / "data" / "pgdata").resolve()
    with serve(embedded_home) as first:
        first.kill()  # SIGKILL: no clean-up at all
    assert postgres_of(pgdata), "the killed run's server is still up"
    (killed_pid,) = json.loads((pgdata / ".handle_pids.json").read_text())
    postmaster = postgres_of(pgdata)[0].pid
    with serve(embedded_home) as second:
        # Joined, not started afresh: the same server answers.
        assert postmaster in {p.pid for p in postgres_of(pgdata)}
        assert second.terminate(60) == 0
    deadline = time.monotonic() + 10
    while postgres_of(pgdata) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert postgres_of(pgdata) == []
    assert killed_pid not in json.loads((pgdata / ".handle_pids.json").read_text())
