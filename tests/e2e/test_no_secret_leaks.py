"""No credential reaches the logs or the stored headers, even at DEBUG and on failures.

Guards the redaction of credentials (issue 6 item 6): `stored_headers` replacing signature,
token and Authorization values with "[redacted]" before they are stored (and shown by the
admin API), and every log line naming only the source, message id, request id and outcome,
never a request's headers, query string or a configured secret. Without the redaction the
stored headers hold the signature and Authorization values; a log line printing the request
(uvicorn's access log, a request line in an error, an exception carrying a header) would
print the token or signature. Also checks the structured form of the logs: one JSON object per
line, and each delivery line with source, message_id, request_id, outcome and duration_ms.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
from pathlib import Path

import asyncpg
import httpx
import pytest

from service.sources.github import github_signature
from tests.processing_helpers import create_effects, wait_until
from tests.server import ServerProcess, serve_env

pytestmark = pytest.mark.slow

SOURCE_SECRET = "leak-test-source-secret-5e1f0c"
GITHUB_SECRET = "leak-test-github-secret-77ab21"
SOURCE_TOKEN = "leak-test-query-token-a9c4d2"
WRONG_TOKEN = "leak-test-wrong-token-0b3e99"
ADMIN_TOKEN = "leak-test-admin-token-6d2f18"
WRONG_ADMIN_TOKEN = "leak-test-wrong-admin-token-c41a07"

TOML = """
[sources.signed]
kind = "generic"
id_header = "x-id"
secrets = ["env:LEAK_SOURCE_SECRET"]
token = "env:LEAK_SOURCE_TOKEN"
handlers = ["tests.handlers:always_fail"]
max_attempts = 2
backoff_base_seconds = 0.05
backoff_max_seconds = 0.1

[sources.signed.hmac]
header = "x-sig"
prefix = "sha256="

[sources.gh]
kind = "github"
secrets = ["env:LEAK_GITHUB_SECRET"]

[sources.synced]
kind = "generic"
id_header = "x-id"
token = "env:LEAK_SOURCE_TOKEN"
mode = "sync"
handlers = ["tests.handlers:always_fail"]
"""

BANNER_PREFIXES = (
    "webhook-inbox serving on",
    "console:",
    "admin tokens:",
    "sources:",
    "send a ",
    "curl ",
)


def hmac_hex(key: str, body: bytes) -> str:
    return hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        return s.recv(200)


async def test_no_secret_reaches_logs_or_stored_headers(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    env = serve_env(
        tmp_path,
        TOML,
        DATABASE_URL=database_url,
        INBOX_LOG_LEVEL="DEBUG",
        INBOX_LOG_FORMAT="json",
        INBOX_ADMIN_TOKENS=ADMIN_TOKEN,
        INBOX_WORKER_POLL_SECONDS="0.1",
        LEAK_SOURCE_SECRET=SOURCE_SECRET,
        LEAK_GITHUB_SECRET=GITHUB_SECRET,
        LEAK_SOURCE_TOKEN=SOURCE_TOKEN,
    )
    body = b'{"amount": 100}'
    good_sig = f"sha256={hmac_hex(SOURCE_SECRET, body)}"
    bad_sig = f"sha256={hmac_hex('not-the-secret', body)}"
    gh_sig = github_signature(GITHUB_SECRET.encode(), body)
    json_type = {"content-type": "application/json"}
    seen: list[str] = []  # every answer's body: the admin API shows stored headers too

    with ServerProcess(env, tmp_path) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:

            async def post(path: str, status: int, **kwargs: object) -> httpx.Response:
                reply = await client.post(path, content=body, **kwargs)  # type: ignore[arg-type]
                assert reply.status_code == status, reply.text
                seen.append(reply.text)
                return reply

            sig = {**json_type, "x-sig": good_sig}
            await post(f"/webhooks/signed?token={SOURCE_TOKEN}", 200, headers={**sig, "x-id": "q"})
            bearer = {"authorization": f"Bearer {SOURCE_TOKEN}"}
            await post("/webhooks/signed", 200, headers={**sig, **bearer, "x-id": "b"})
            await post(f"/webhooks/signed?token={WRONG_TOKEN}", 401, headers={**sig, "x-id": "w"})
            await post(
                "/webhooks/signed",
                401,
                headers={**json_type, **bearer, "x-sig": bad_sig, "x-id": "forged"},
            )
            await post(
                "/webhooks/gh",
                200,
                headers={
                    **json_type,
                    "x-hub-signature-256": gh_sig,
                    "x-github-delivery": "gh-1",
                    "x-github-event": "push",
                    "cookie": f"session={SOURCE_TOKEN}",
                },
            )
            # A sync handler failing answers 500 and logs the exception with its traceback.
            await post(f"/webhooks/synced?token={SOURCE_TOKEN}", 500, headers={"x-id": "s"})
            # Requests the HTTP parser refuses, carrying the token in their request line.
            for bad in (b"X-Id: a\x00b", b"Content-Length: zz"):
                head = f"POST /webhooks/signed?token={SOURCE_TOKEN} HTTP/1.1\r\nHost: x\r\n"
                answer = raw_request(server.port, head.encode() + bad + b"\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 400"), answer

            admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            wrong = {"authorization": f"Bearer {WRONG_ADMIN_TOKEN}"}
            assert (await client.get("/admin/messages", headers=wrong)).status_code == 401
            listing = await client.get("/admin/messages", headers=admin)
            assert listing.status_code == 200
            for item in listing.json()["items"]:
                detail = await client.get(f"/admin/messages/{item['id']}", headers=admin)
                seen.append(detail.text)
            seen.append((await client.get("/admin/sources", headers=admin)).text)

            # The failing handlers have run their attempts and logged their errors.
            await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'dead'", 2)
            retried = await client.post("/admin/messages/retry", headers=admin, json={})
            assert retried.status_code == 200
        await asyncio.to_thread(server.terminate)
        output = server.output()

    stored = [row["headers"] for row in await db.fetch("SELECT headers::text FROM inbox_messages")]
    assert len(stored) == 3  # q, b and gh-1; the refused and the sync failure recorded nothing
    assert all("[redacted]" in h for h in stored)
    errors = [r["error"] or "" for r in await db.fetch("SELECT error FROM inbox_attempts")]
    assert any("downstream says no" in e for e in errors)

    secrets = {
        "source secret": SOURCE_SECRET,
        "github secret": GITHUB_SECRET,
        "token": SOURCE_TOKEN,
        "wrong token": WRONG_TOKEN,
        "admin token": ADMIN_TOKEN,
        "wrong admin token": WRONG_ADMIN_TOKEN,
        "signature header": good_sig.removeprefix("sha256="),
        "forged signature header": bad_sig.removeprefix("sha256="),
        "github signature header": gh_sig.removeprefix("sha256="),
    }
    places = {
        "server output": output,
        "stored headers": "\n".join(stored),
        "attempt errors": "\n".join(errors),
        "API answers": "\n".join(seen),
    }
    leaks = [
        f"{name} in {where}"
        for name, secret in secrets.items()
        for where, text in places.items()
        if secret in text
    ]
    assert not leaks, leaks

    # The logs are structured: one JSON object per line (the start-up banner aside).
    events = []
    for line in output.splitlines():
        if line.startswith(BANNER_PREFIXES):
            continue
        events.append(json.loads(line))
    deliveries = [e for e in events if e["event"] == "delivery"]
    assert len(deliveries) >= 6
    for event in deliveries:
        assert {"source", "message_id", "request_id", "outcome", "duration_ms"} <= set(event)
    outcomes = {(e["source"], e["message_id"], e["outcome"]) for e in deliveries}
    assert ("signed", "q", "accepted") in outcomes
    assert ("signed", None, "rejected:unauthenticated") in outcomes
    assert ("synced", "s", "failed:handler") in outcomes
    assert any(e["event"] == "handler failed" for e in events)
