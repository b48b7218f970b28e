"""Accept-to-processed latency: a real `webhook-inbox serve` (worker in-process), one message
at a time over HTTP, measured from the database's received_at to processed_at.

    DATABASE_URL=postgresql://... .venv/bin/python bench/latency.py [messages]

Without DATABASE_URL it starts a throwaway embedded PostgreSQL. The handler inserts one row.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.handlers import EFFECTS_DDL  # noqa: E402
from tests.pg import EmbeddedServer, asyncpg_dsn, create_database, with_database  # noqa: E402

TOML = """
[sources.bench]
kind = "generic"
id_header = "X-Message-Id"
handlers = ["tests.handlers:record"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main(count: int) -> None:
    embedded = None
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        embedded = EmbeddedServer()
        server_url = embedded.url
    url = with_database(server_url, await create_database(server_url))
    tmp = Path(tempfile.mkdtemp())
    (tmp / "inbox.toml").write_text(TOML)
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "INBOX_CONFIG": str(tmp / "inbox.toml"),
        "INBOX_DATA_DIR": str(tmp / "data"),
        "INBOX_LOG_LEVEL": "WARNING",
        "INBOX_ADMIN_TOKENS": "bench-token",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)], cwd=ROOT, env=env
    )
    db = await asyncpg.connect(asyncpg_dsn(url))
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as client:
            for _ in range(200):
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            await db.execute(EFFECTS_DDL)
            for i in range(count):
                headers = {"x-message-id": f"b{i}", "content-type": "application/json"}
                response = await client.post("/webhooks/bench", content=b"{}", headers=headers)
                assert response.status_code == 200, response.text
                await asyncio.sleep(0.02)  # one at a time: latency, not throughput
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = await db.fetchval(
                "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
            )
            if done == count:
                break
            await asyncio.sleep(0.1)
        rows = await db.fetch(
            "SELECT extract(epoch FROM processed_at - received_at) * 1000 AS ms "
            "FROM inbox_messages WHERE status = 'processed'"
        )
        claim = await db.fetch(
            "SELECT extract(epoch FROM a.started_at - m.received_at) * 1000 AS ms "
            "FROM inbox_messages m JOIN inbox_attempts a ON a.message_id = m.id"
        )
        to_start = statistics.median(float(r["ms"]) for r in claim)
        print(f"received to handler start p50 {to_start:.1f} ms")
        latencies = sorted(float(r["ms"]) for r in rows)
        p50 = statistics.median(latencies)
        print(
            f"{len(latencies)} messages: accept-to-processed p50 {p50:.1f} ms, "
            f"p90 {latencies[int(len(latencies) * 0.9)]:.1f} ms, max {latencies[-1]:.1f} ms"
        )
    finally:
        await db.close()
        server.terminate()
        server.wait(20)
        if embedded is not None:
            embedded.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
