"""The processing process's niceness: raised to the setting on every thread, never lowered."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In a child process of its own: a niceness once raised cannot be lowered again unprivileged.
PROBE = """
import os, sys, threading
from service.worker.priority import yield_to_ingest
os.nice(int(sys.argv[2]))
started = threading.Event()
threading.Thread(target=lambda: (started.set(), threading.Event().wait()), daemon=True).start()
started.wait()
print(yield_to_ingest(int(sys.argv[1])))
print(sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}))
"""


def niceness_after(setting: int, started_at: int) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(setting), str(started_at)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split("\n")[:2]


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
def test_every_running_thread_is_raised_to_the_setting() -> None:
    assert niceness_after(10, 0) == ["10", "[10]"]


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
def test_a_process_started_nicer_stays_so() -> None:
    assert niceness_after(5, 12) == ["12", "[12]"]
