"""What GitHub sends: its documented test vector, and deliveries signed as GitHub signs them."""

from __future__ import annotations

import json
from typing import Any

from service.sources.github import github_signature

# docs.github.com "Validating webhook deliveries" -> "Testing the webhook payload validation".
DOC_SECRET = "It's a Secret to Everybody"
DOC_PAYLOAD = b"Hello, World!"
DOC_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

SECRET = "gh-webhook-secret-0123456789"
OLD_SECRET = "gh-webhook-secret-rotated-out"
CONFIG: dict[str, Any] = {"sources": {"gh": {"kind": "github", "secrets": [OLD_SECRET, SECRET]}}}


def signed(
    payload: dict[str, Any] | bytes,
    event: str = "issues",
    delivery: str | None = "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    secret: str = SECRET,
) -> tuple[bytes, dict[str, str]]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {
        "content-type": "application/json",
        "x-github-event": event,
        "x-hub-signature-256": github_signature(secret.encode(), body),
        "user-agent": "GitHub-Hookshot/044aadd",
    }
    if delivery is not None:
        headers["x-github-delivery"] = delivery
    return body, headers
