"""Starting `webhook-inbox worker` (or `consume`) as a real process against the test database."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

from service.store.notifications import wait_for_listeners

ROOT = Path(__file__).resolve().parents[1]


def start_worker(
    database_url: str,
    config_toml: str,
    tmp_path: Path,
    name: str,
    command: str = "worker",
    **env: str,
) -> subprocess.Popen[bytes]:
    """`webhook-inbox worker` (or `command`: `consume`) on `database_url`, logging to
    `tmp_path/NAME.log`."""
    config = tmp_path / f"{name}.toml"
    config.write_text(config_toml)
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("INBOX_")},
        "DATABASE_URL": database_url,
        "INBOX_CONFIG": str(config),
        "INBOX_LOG_FORMAT": "text",
        "INBOX_WORKER_POLL_SECONDS": "0.2",
        **env,
    }
    log = (tmp_path / f"{name}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "service", command],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def wait_listening(db: asyncpg.Connection, count: int, timeout: float = 30) -> None:
    """Until `count` worker listeners are connected to this test's database."""
    async with asyncio.timeout(timeout):
        await wait_for_listeners(db, count, interval=0.1)


async def stop(process: subprocess.Popen[bytes], timeout: float = 20) -> int:
    process.terminate()
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if process.poll() is None:
        process.kill()
    return process.wait()


def crash(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as in a crash (no shutdown handlers run), and wait until it is gone."""
    process.send_signal(signal.SIGKILL)
    process.wait()
