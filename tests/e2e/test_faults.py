"""Faults of the real server process: a service killed and started again keeps its dedup state."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.server import http_only


async def test_restarted_service_keeps_dedup_state(database_url: str, tmp_path: Path) -> None:
    sources = '[sources.s]\nkind = "generic"\nid_header = "x-id"\n'
    with http_only(tmp_path, database_url, sources) as server:
        first = httpx.post(f"{server.url}/webhooks/s", content=b"a", headers={"x-id": "keep"})
        assert first.json()["status"] == "accepted"
        server.kill()
    with http_only(tmp_path, database_url, sources) as server:
        second = httpx.post(f"{server.url}/webhooks/s", content=b"a", headers={"x-id": "keep"})
    assert second.status_code == 200
    assert second.json() == {"status": "duplicate", "message_id": "keep"}
