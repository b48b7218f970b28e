"""Run a piece of a test in a forked child of the test process, as `serve` forks its HTTP and
processing processes, and read back what it made."""

from __future__ import annotations

import os
from collections.abc import Callable


def in_forked_child(work: Callable[[], str]) -> tuple[int, str]:
    """Fork; in the child, run `work` and hand its text back through a pipe. Returns the
    child's pid and that text; fails if the child did not exit cleanly."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            os.write(write, work().encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the forked child failed: {status}"
    return pid, text
