"""The `serve` supervisor's own parts: restart backoff, how an exit status reads, how a forked
child's exit is read, and a child's check that its supervisor still lives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from service.supervisor import ForkedProcess, describe_exit, restart_delay


def test_restart_delay_doubles_to_its_cap() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay(50) == 30.0


def test_exit_statuses_read_as_people_say_them() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-11) == "killed by SIGSEGV"


def test_a_child_reaped_elsewhere_reads_as_exited_not_as_an_error() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(3)
    os.waitpid(pid, 0)  # someone else collects the status first
    child = ForkedProcess(pid)
    assert child.poll() == 0
    assert child.wait(timeout=1) == 0
    # A child known to be gone is not signalled (its pid may be another process's by now):
    # os.kill on a pid nobody holds would raise ProcessLookupError here.
    child.send_signal(signal.SIGTERM)


def test_a_forked_child_reads_its_own_exit_code() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(3)
    assert ForkedProcess(pid).wait(timeout=5) == 3


# In a fresh interpreter: prctl through ctypes (dlopen) in a fork of this multi-threaded test
# process could find a lock another thread held at the fork.
CHECK_PARENT = """
import os, sys
from service.supervisor import _die_with_parent
_die_with_parent(os.getppid() + int(sys.argv[1]))
print("went on")
"""


def check_parent(offset: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", CHECK_PARENT, str(offset)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_a_child_whose_supervisor_is_already_gone_leaves_at_once() -> None:
    # As if reparented: the parent it finds is not the supervisor it was started by.
    done = check_parent(1)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")


def test_a_child_of_a_live_supervisor_goes_on() -> None:
    done = check_parent(0)
    assert (done.returncode, done.stdout, done.stderr) == (0, "went on\n", "")
