"""The real `webhook-inbox serve` in a child process, for end-to-end tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import httpx

from tests.worker_process import ROOT

# Every server a test has started and still holds: a failed test's report shows their logs
# (tests/e2e/conftest.py), which the test's temporary directory would otherwise take away.
STARTED: weakref.WeakSet[ServerProcess] = weakref.WeakSet()

# For the tests that read what `serve` logs: one JSON object a line, each delivery's among them.
JSON_LOGS = {"INBOX_LOG_LEVEL": "INFO", "INBOX_LOG_FORMAT": "json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """Runs `webhook-inbox serve` (or another command) and waits until it answers /healthz."""

    def __init__(
        self,
        env: dict[str, str],
        workdir: Path,
        args: list[str] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        # "{port}" in `args` stands for the port chosen here.
        self.args = [
            a.replace("{port}", str(self.port)) for a in args or ["serve", "--port", "{port}"]
        ]
        self.env = {
            **os.environ,
            "INBOX_DATA_DIR": str(workdir / "data"),
            "INBOX_LOG_LEVEL": "WARNING",
            **env,
        }
        self.startup_timeout = startup_timeout
        self.log_path = workdir / f"server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        self.log = self.log_path.open("wb")
        self.started_at = time.monotonic()
        STARTED.add(self)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service", *self.args],
            env=self.env,
            cwd=self.workdir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.startup_timeout
        # One client for the whole wait: each new one loads the CA bundle (~40 ms of CPU),
        # which a poll every 0.1 s would pay dozens of times per start.
        with httpx.Client(timeout=1) as poll:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited at start:\n{self.output()}")
                try:
                    if poll.get(f"{self.url}/healthz").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        self.kill()
        raise RuntimeError(
            f"server did not answer within {self.startup_timeout}s:\n{self.output()}"
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON lines of the output (`JSON_LOGS`), the start-up banner's plain lines aside."""
        return [json.loads(line) for line in self.output().splitlines() if line.startswith("{")]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, as in a crash."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def __exit__(self, *exc: object) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


async def timed_deliveries(
    server: ServerProcess, count: int, prefix: str, every: float = 0.0
) -> list[float]:
    """Post `count` new deliveries of `{}` to the source `s` (ids `<prefix>0`, `<prefix>1`…
    in `x-id`), one after the other, `every` seconds apart; each must be accepted. Their
    latencies, in seconds, in the order sent."""
    latencies = []
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        for i in range(count):
            began = time.perf_counter()
            headers = {"x-id": f"{prefix}{i}"}
            reply = await client.post("/webhooks/s", content=b"{}", headers=headers)
            latencies.append(time.perf_counter() - began)
            assert reply.status_code == 200, reply.text
            assert reply.json()["status"] == "accepted", reply.text
            await asyncio.sleep(every)
    return latencies


def handler_source(handler: str, name: str = "s", id_header: str = "x-id", **extra: Any) -> str:
    """A sources file's table of one generic source, `name`, reading its message ids from
    `id_header` and running `tests.handlers:<handler>`; `extra` are further keys of it."""
    lines = [
        f"[sources.{name}]",
        'kind = "generic"',
        f'id_header = "{id_header}"',
        f'handlers = ["tests.handlers:{handler}"]',
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def serve_env(workdir: Path, sources_toml: str, **env: str) -> dict[str, str]:
    """The environment of a `serve` in `workdir` reading `sources_toml` as its sources file,
    whose handlers may live in tests/, and whose worker polls often."""
    config = workdir / "inbox.toml"
    config.write_text(sources_toml)
    return {
        "INBOX_CONFIG": str(config),
        "INBOX_WORKER_POLL_SECONDS": "0.2",
        "PYTHONPATH": str(ROOT),  # the handlers live in tests/
        **env,
    }


def http_only(workdir: Path, database_url: str, sources_toml: str, **env: str) -> ServerProcess:
    """`serve --no-worker` on `database_url`: for tests of the HTTP side, whose sources have no
    handlers, so a processing process would only cost its start-up."""
    environment = serve_env(workdir, sources_toml, DATABASE_URL=database_url, **env)
    return ServerProcess(environment, workdir, args=["serve", "--no-worker", "--port", "{port}"])
