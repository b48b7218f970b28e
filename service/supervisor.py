"""`webhook-inbox serve`'s parent process: it only supervises the HTTP and processing children.

As gunicorn's arbiter and uvicorn's supervisor do: the work happens in children that can die
alone. A child that exits is logged with its exit status and started again after a backoff
that doubles while it keeps dying young; SIGTERM, SIGINT or SIGHUP is passed on to every child
as SIGTERM, and the parent waits for them to drain before it returns.

On Linux a role with `run` starts as a fork of the supervisor, as gunicorn starts its workers:
the child begins with the modules the supervisor imported, so a start or restart costs about a
tenth of the CPU an interpreter importing them all again would. Elsewhere, or while this process
runs a thread besides the main one (fork copies only the calling thread, and any lock another
one held stays held), the child executes `argv` instead.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import NoReturn, Protocol

log = logging.getLogger("service.supervisor")

# Backoff before restarting a child: doubles from the first to the cap while the child keeps
# exiting within STABLE_SECONDS of its start, and starts over once one has lived that long.
FIRST_RESTART_SECONDS = 0.5
MAX_RESTART_SECONDS = 30.0
STABLE_SECONDS = 30.0
TICK_SECONDS = 0.05


@dataclass(frozen=True)
class Role:
    """One kind of child: how to start it and how many run at once."""

    name: str
    argv: Sequence[str]
    count: int
    pass_fds: tuple[int, ...] = ()
    # What a forked child runs, in place of executing `argv`; its process title on Linux.
    run: Callable[[], object] | None = None
    title: str = ""


class Process(Protocol):
    """What the supervisor uses of a child: `subprocess.Popen`'s calls, or `ForkedProcess`'s."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


@dataclass
class Child:
    role: Role
    slot: int
    process: Process | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = 0.0  # when to (re)start; None while running

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def restart_delay(failures: int) -> float:
    exponent = min(max(failures - 1, 0), 16)
    return float(min(FIRST_RESTART_SECONDS * 2**exponent, MAX_RESTART_SECONDS))


def _die_with_parent(parent: int) -> None:
    """Linux: a child gets SIGTERM (and drains) if the supervisor, pid `parent`, is killed.

    Runs in the child, between fork and exec (or `run`). A supervisor killed before the
    request took effect sent no signal: the child, reparented already, leaves at once, before
    it has taken any work (or it would serve on, with nobody to stop it).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


class ForkedProcess:
    """A forked child, with the `subprocess.Popen` calls the supervisor makes of its children
    (a status is the exit code, or minus the signal that killed it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Reaped by someone else (SIGCHLD ignored, a stray waitpid(-1)): the child is
                # gone and its status with it. subprocess.Popen.poll says 0 then, and so does
                # this, rather than let the error stop the supervisor.
                self.returncode = 0
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(TICK_SECONDS / 5)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def can_fork() -> bool:
    """Whether a child may be forked from this process now: Linux, and no thread but this one."""
    return sys.platform == "linux" and threading.active_count() == 1


def fork(run: Callable[[], object], title: str, env: Mapping[str, str]) -> ForkedProcess:
    """Start `run` in a child forked from this process, titled `title`, with `env` as its
    environment."""
    sys.stdout.flush()  # or the child would write what this process had buffered a second time
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns here; its tests watch it run
        _run_forked(run, title, env, parent)
    return ForkedProcess(pid)


def _run_forked(  # pragma: no cover - in a child
    run: Callable[[], object], title: str, env: Mapping[str, str], parent: int
) -> NoReturn:
    """The forked child: set up as an executed one would be, call `run`, and leave by
    `os._exit`. Returning or raising would unwind the supervisor's own stack, whose `finally`
    blocks remove its state directory and stop the embedded PostgreSQL."""
    status = 1
    try:
        os.setpgid(0, 0)  # as `process_group=0`: the terminal's Ctrl-C reaches the supervisor
        _die_with_parent(parent)
        # The supervisor's handlers would only set a flag in this copy of it.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        atexit._clear()  # the supervisor's exit functions are its own; the child's run below
        _set_title(title)  # first: setproctitle needs the environment as it was
        environment = dict(env)  # `env` may be os.environ itself
        os.environ.clear()
        os.environ.update(environment)
        run()
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _exit_status(exc: SystemExit) -> int:
    """What the interpreter would exit with after `exc`, printing a message as it would."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _set_title(title: str) -> None:  # pragma: no cover - in a child
    """What `ps` and `top` show for a forked child: otherwise the supervisor's command line."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


class Supervisor:
    """Keeps `roles` running until a stop signal, then drains them within `stop_timeout`."""

    def __init__(
        self,
        roles: Sequence[Role],
        env: Mapping[str, str],
        state_path: Path,
        *,
        stop_timeout: float,
    ) -> None:
        self.children = [Child(role, slot) for role in roles for slot in range(role.count)]
        self.env = dict(env)
        self.state_path = state_path
        self.stop_timeout = stop_timeout
        self._stop_signal: int | None = None
        self._written: dict[str, int] | None = None
        self._told_exec = False

    def run(self) -> int:
        """Supervise until asked to stop; 0 once every child has exited."""
        previous = self._install_signal_handlers()
        try:
            while self._stop_signal is None:
                self._tick()
                time.sleep(TICK_SECONDS)
            log.info(
                "stopping: draining every child",
                extra={"signal": signal.Signals(self._stop_signal).name},
            )
            self._drain()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 0

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum

    # One pass: notice exits, start what is due, publish the state -------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if (
                process is not None
                and child.restart_at is None
                and (code := process.poll()) is not None
            ):
                lived = now - child.started_at
                child.failures = 1 if lived >= STABLE_SECONDS else child.failures + 1
                delay = restart_delay(child.failures)
                child.restart_at = now + delay
                log.error(
                    "child exited; restarting it",
                    extra={
                        "child_role": child.role.name,
                        "child_pid": process.pid,
                        "exit_status": describe_exit(code),
                        "lived_s": round(lived, 3),
                        "restart_in_s": delay,
                    },
                )
            if child.restart_at is not None and child.restart_at <= now:
                self._start(child)
        self._publish()

    def _start(self, child: Child) -> None:
        role = child.role
        run = role.run if can_fork() else None
        if role.run is not None and run is None and not self._told_exec:
            self._told_exec = True
            log.info(
                "children are executed, not forked",
                extra={"platform": sys.platform, "threads": threading.active_count()},
            )
        try:
            if run is not None:
                child.process = fork(run, role.title or role.name, self.env)
            else:
                child.process = subprocess.Popen(
                    list(role.argv),
                    env=self.env,
                    pass_fds=role.pass_fds,
                    process_group=0,  # the terminal's Ctrl-C reaches the supervisor alone
                    preexec_fn=partial(_die_with_parent, os.getpid())
                    if sys.platform == "linux"
                    else None,
                )
        except OSError as exc:
            child.failures += 1
            child.restart_at = time.monotonic() + restart_delay(child.failures)
            log.error(
                "could not start child",
                extra={"child_role": role.name, "error": f"{type(exc).__name__}: {exc}"},
            )
            return
        child.started_at = time.monotonic()
        child.restart_at = None
        log.info("child started", extra={"child_role": role.name, "child_pid": child.process.pid})

    def alive_by_role(self) -> dict[str, int]:
        counts = {child.role.name: 0 for child in self.children}
        for child in self.children:
            if child.restart_at is None and child.alive:
                counts[child.role.name] += 1
        return counts

    def _publish(self) -> None:
        """Write how many children of each role are alive and expected, for `/readyz`."""
        state = {f"{name}_alive": n for name, n in self.alive_by_role().items()}
        for child in self.children:
            key = f"{child.role.name}_expected"
            state[key] = state.get(key, 0) + 1
        if state == self._written:
            return
        partial = self.state_path.with_suffix(".tmp")
        partial.write_text(json.dumps(state))
        os.replace(partial, self.state_path)
        self._written = state

    # Stopping ------------------------------------------------------------------------------

    def _drain(self) -> None:
        running = [c.process for c in self.children if c.process is not None]
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for process in running:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.error(
                    "child did not drain in time; killing it",
                    extra={"child_pid": process.pid, "stop_timeout_s": self.stop_timeout},
                )
                process.kill()
                process.wait()
        for child in self.children:
            # uvicorn re-raises the SIGTERM it drained on: that exit is a clean one too.
            clean = (0, None, -signal.SIGTERM)
            if child.process is not None and child.process.returncode not in clean:
                log.warning(
                    "child stopped",
                    extra={
                        "child_role": child.role.name,
                        "child_pid": child.process.pid,
                        "exit_status": describe_exit(child.process.returncode),
                    },
                )
        self._publish()

    def _install_signal_handlers(
        self,
    ) -> dict[int, Callable[[int, FrameType | None], object] | int | None]:
        previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.request_stop(signum)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous[signum] = signal.signal(signum, on_signal)
        return previous
