"""The `serve` supervisor with real child processes: restarts with backoff, exit statuses, drain."""

from __future__ import annotations

import json
import logging
import os
import subprocess
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
    # A thread runs beside the supervisor here (the watcher), so no child may be forked: the
    # HTTP role's `run`, which returns at once, must not be what its children run.
    roles = [Role("processing", DIES_YOUNG, 1), Role("http", STEADY, 2, run=lambda: None)]
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
    assert [r.getMessage() for r in caplog.records].count("children are executed, not forked") == 1
    # What /readyz reads: both HTTP children alive all along, the processing one on and off.
    assert all(s["http_alive"] == 2 and s["http_expected"] == 2 for s in seen)
    assert {s["processing_alive"] for s in seen} == {0, 1}
    # Stopped: SIGTERM reached every child, and none outlived the supervisor.
    for child in supervisor.children:
        assert isinstance(child.process, subprocess.Popen)  # executed, not forked
        assert child.process.poll() is not None


# A supervisor of its own (pytest's process runs threads, so it forks nothing): it forks one
# child per role below, with cleanup of its own in an exit function, a `finally` and a SIGTERM
# handler, none of which a child may run.
FORKING = """
import atexit, os, signal, sys, time
from pathlib import Path
from service.supervisor import fork

out = Path(sys.argv[1])


def note(name):
    with (out / name).open("a") as f:
        f.write(f"{os.getpid()}\\n")


atexit.register(note, "supervisor-atexit")
signal.signal(signal.SIGTERM, lambda *_: note("supervisor-on-sigterm"))


def returns():
    atexit.register(note, "child-atexit")
    print("env:", dict(os.environ), flush=True)


def exits():
    raise SystemExit("config error: in one line")


def raises():
    raise RuntimeError("boom")


def waits():
    note("waiting")
    time.sleep(60)


try:
    statuses = []
    for run in (returns, exits, raises):
        statuses.append(fork(run, run.__name__, {"ONLY": "this"}).wait(30))
    waiting = fork(waits, "test-child: waits", {})
    while not (out / "waiting").exists():
        time.sleep(0.01)
    title = Path(f"/proc/{waiting.pid}/cmdline").read_bytes().split(b"\\0")[0].decode()
    waiting.send_signal(signal.SIGTERM)
    statuses.append(waiting.wait(30))
    print("statuses:", statuses, "title:", title, "pid:", os.getpid(), flush=True)
finally:
    note("supervisor-finally")
"""


def test_a_forked_child_runs_its_role_alone_and_leaves_the_supervisors_cleanup_to_it(
    tmp_path: Path,
) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", FORKING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NOT_FOR_CHILDREN": "1"},
    )
    assert ran.returncode == 0, ran.stderr
    env_line, status_line = ran.stdout.splitlines()
    assert env_line == "env: {'ONLY': 'this'}"  # the role's environment, nothing inherited
    *_, supervisor = status_line.split()
    # Returned: 0; SystemExit with a message: 1, the message printed; an exception: 1, its
    # traceback printed; SIGTERM: killed by it, the supervisor's handler not run.
    assert status_line == f"statuses: [0, 1, 1, -15] title: test-child: waits pid: {supervisor}"
    assert ran.stderr.count("config error: in one line\n") == 1
    assert "RuntimeError: boom" in ran.stderr
    noted = {path.name: path.read_text().split() for path in tmp_path.iterdir()}
    (child,) = noted.pop("child-atexit")  # the child's own exit function ran, in the child
    assert child != supervisor
    (waiting,) = noted.pop("waiting")
    assert waiting not in (child, supervisor)
    assert noted == {"supervisor-atexit": [supervisor], "supervisor-finally": [supervisor]}
