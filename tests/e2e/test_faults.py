"""Faults of the real server process: a service killed and started again keeps its dedup state."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.server import ServerProcess


async def test_restarted_service_keeps_dedup_state(database_url: str, tmp_path: Path) -> None:
    config = tmp_path / "inbox.toml"
    config.write_text('[sources.s]\nkind = "generic"\nid_header = "x-id"\n')
    env = {"DATABASE_URL": database_url, "INBOX_CONFIG": str(config)}
    with ServerProcess(env, tmp_path) as server:
        first = httpx.post(f"{server.url}/webhooks/s", content=b"a", headers={"x-id": "keep"})
        assert first.json()["status"] == "accepted"
        server.kill()
    with ServerProcess(env, tmp_path) as server:
        second = httpx.post(f"{server.url}/webhooks/s", content=b"a", headers={"x-id": "keep"})
    assert second.status_code == 200
    assert second.json() == {"status": "duplicate", "message_id": "keep"}
