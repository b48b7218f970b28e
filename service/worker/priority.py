"""The processing process's CPU priority: below ingest's, so that a backlog drains on what
ingest leaves (docs/operating.md#catching-up-after-an-outage)."""

from __future__ import annotations

import os
from pathlib import Path


def yield_to_ingest(niceness: int) -> int:
    """Raise this process's niceness to `niceness` (never lower it: that needs privilege, and
    a process started under `nice` wants less); the niceness it runs at, returned.

    On Linux a niceness is each thread's own, so every thread already running is set, and
    those started later inherit it."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness <= current:
        return current
    tasks = Path("/proc/self/task")
    threads = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for thread in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, thread, niceness)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return os.getpriority(os.PRIO_PROCESS, 0)
