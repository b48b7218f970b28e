"""The receivers under test as child processes, and their memory while they run."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from service.serve import child_title


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants: `serve`'s supervisor, HTTP and processing children."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += sum(process.cpu_times()[:2])
    return total


def tree_rss_bytes(processes: list[psutil.Process]) -> int:
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


class MemorySampler:
    """Peak RSS of the largest process in a process tree, sampled every `interval` seconds
    (under `serve` the supervisor does no request work: its children are what counts)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            for process in [self.process, *self.process.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    self.peak = max(self.peak, process.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.peak


class Server:
    """One uvicorn process: started, waited for (GET /healthz), sampled, stopped.

    Its memory is sampled from start to stop, or with `sample_memory=False` only inside
    `sampling_memory()`: bench/ingest runs every system at once and samples each only under
    its own load, so that idle servers' samplers do not take CPU from the one under test."""

    def __init__(
        self,
        name: str,
        command: list[str],
        env: dict[str, str],
        log: Path,
        *,
        sample_memory: bool = True,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [*command, "--host", "127.0.0.1", "--port", str(self.port)]
        self.env = {**os.environ, **env}
        self.log_path = log
        self.process: subprocess.Popen[bytes] | None = None
        self.sample_memory = sample_memory
        self.memory: MemorySampler | None = None
        self.peak_rss = 0

    def __enter__(self) -> Server:
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            self.process.kill()
            raise RuntimeError(f"{self.name} did not answer /healthz; see {self.log_path}")
        if self.sample_memory:
            self.memory = MemorySampler(self.process.pid)
            self.memory.start()
        return self

    @contextlib.contextmanager
    def sampling_memory(self) -> Iterator[None]:
        """Sample the process tree's memory while the body runs; the peak counts in
        `peak_rss`."""
        sampler = MemorySampler(self.pid)
        sampler.start()
        try:
            yield
        finally:
            self.peak_rss = max(self.peak_rss, sampler.stop())

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def http_pid(self) -> int:
        """The process that serves requests: under `serve`, its (first) HTTP child, found by
        its title when forked and by its command line when executed (service/serve.py)."""
        for process in process_tree(self.pid)[1:]:
            with contextlib.suppress(psutil.Error):
                command = " ".join(process.cmdline())
                if child_title("http") in command or "-m service.serve" in command:
                    return process.pid
        return self.pid

    def __exit__(self, *exc: object) -> None:
        if self.memory is not None:
            self.peak_rss = max(self.peak_rss, self.memory.stop())
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
