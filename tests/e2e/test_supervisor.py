"""The `serve` supervisor with real child processes: restarts with backoff, exit statuses, drain."""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path

import pytest

from service.supervisor import Role, Supervisor

DIES_YOUNG = [sys.executable, "-c", "import sys, time; time.sleep(0.1); sys.exit(3)"]
STEADY = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_child_that_keeps_dying_is_restarted_later_each_time_and_the_rest_drain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.supervisor")
    state = tmp_path / "children.json"
    roles = [Role("processing", DIES_YOUNG, 1), Role("http", STEADY, 2)]
    supervisor = Supervisor(roles, {}, state, stop_timeout=10)
    seen: list[dict[str, int]] = []

    def watch_then_stop() -> None:
        for _ in range(40):  # 4 s
            if state.exists():
                seen.append(json.loads(state.read_text()))
            threading.Event().wait(0.1)
        supervisor.request_stop()

    watcher = threading.Thread(target=watch_then_stop)
    watcher.start()
    assert supervisor.run() == 0
    watcher.join()
    exits = [r.__dict__ for r in caplog.records if r.getMessage() == "child exited; restarting it"]
    assert [e["restart_in_s"] for e in exits[:3]] == [0.5, 1.0, 2.0]
    assert {e["exit_status"] for e in exits} == {"exit code 3"}
    assert {e["child_role"] for e in exits} == {"processing"}
    # What /readyz reads: both HTTP children alive all along, the processing one on and off.
    assert all(s["http_alive"] == 2 and s["http_expected"] == 2 for s in seen)
    assert {s["processing_alive"] for s in seen} == {0, 1}
    # Stopped: SIGTERM reached every child, and none outlived the supervisor.
    for child in supervisor.children:
        assert child.process is not None
        assert child.process.poll() is not None
