"""The `serve` supervisor on its own: restarts with backoff, exit statuses, drain, readiness."""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path

import pytest

from service.app import create_app
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from service.supervisor import Role, Supervisor, describe_exit, restart_delay
from tests.conftest import running

DIES_YOUNG = [sys.executable, "-c", "import sys, time; time.sleep(0.1); sys.exit(3)"]
STEADY = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_restart_delay_doubles_to_its_cap() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay(50) == 30.0


def test_exit_statuses_read_as_people_say_them() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-11) == "killed by SIGSEGV"


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


async def test_readyz_is_not_ready_while_no_processing_process_is_alive(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "children.json"
    settings = Settings(database_url=database_url, data_dir=tmp_path / "data")
    app = create_app(settings, parse_inbox_config({}), processing_state=state)
    async with running(app) as client:
        state.write_text(json.dumps({"processing_expected": 1, "processing_alive": 0}))
        down = await client.get("/readyz")
        assert down.status_code == 503
        assert down.headers["retry-after"] == "5"
        assert "no processing process is alive" in down.json()["detail"]
        state.write_text(json.dumps({"processing_expected": 1, "processing_alive": 1}))
        assert (await client.get("/readyz")).status_code == 200
        # `serve --no-worker`: none expected, so none missing.
        state.write_text(json.dumps({"processing_expected": 0, "processing_alive": 0}))
        assert (await client.get("/readyz")).status_code == 200
