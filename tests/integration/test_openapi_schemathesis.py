"""Property-based run of the rest of the OpenAPI (ingest, health, metrics): no 5xx, as documented.

Complements tests/integration/test_admin_schemathesis.py (the admin API) so that every
operation of the schema is exercised (issue 6 item 5). Guards the ingest path's error handling:
any body, header or content type a sender can produce is answered with a documented status,
body and content type, never a 5xx (a crash in a verifier or id extractor would be one). The
database is up throughout, so the documented 503 must not appear either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import pytest
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.app import create_app
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from tests.processing_helpers import create_effects
from tests.schema_runs import schema_run_settings

MAX_EXAMPLES = 40

SECRET = "schemathesis-source-secret"
SOURCES: dict[str, Any] = {
    # Accepts any body: the id comes from the JSON `id`, else from the body's hash.
    "open": {
        "kind": "generic",
        "id_json_pointer": "/id",
        "id_fallback": "body-sha256",
        "event_type_json_pointer": "/type",
    },
    # Runs its handler inside the request's transaction (sync mode).
    "synced": {
        "kind": "generic",
        "id_fallback": "body-sha256",
        "mode": "sync",
        "handlers": ["tests.handlers:record"],
    },
    # The event type from a header, the id from the body's hash: any headers are read.
    "typed": {"kind": "generic", "id_fallback": "body-sha256", "event_type_header": "x-type"},
    "ce": {"kind": "cloudevents"},  # binary, structured and batch modes; the OPTIONS handshake
    "dapr": {"kind": "dapr"},
    "eventgrid": {"kind": "eventgrid"},
    "pubsub": {"kind": "pubsub", "event_type_attribute": "type", "allow_unauthenticated": True},
    # The signed kinds: what is generated reaches their verifiers, which refuse it.
    "stripe": {"kind": "stripe", "secrets": [SECRET]},
    "github": {"kind": "github", "secrets": [SECRET]},
    "shopify": {"kind": "shopify", "secrets": [SECRET]},
    "slack": {"kind": "slack", "secrets": [SECRET]},
    "standard-webhooks": {"kind": "standard-webhooks", "secrets": ["whsec_" + "A" * 32]},
}
# The generated `{source}` is replaced by a configured one most of the time, so deliveries
# reach the verifiers instead of stopping at 404.
SOURCE_NAMES = st.sampled_from([*SOURCES, None])


@pytest.fixture
async def api(database_url: str, data_dir: Path, db: asyncpg.Connection) -> Any:
    await create_effects(db)
    app = create_app(
        Settings(database_url=database_url, data_dir=data_dir, admin_tokens=["t" * 32]),
        parse_inbox_config({"sources": SOURCES}),
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def expected_statuses(method: str, path: str, source_configured: bool) -> set[int]:
    if path != "/webhooks/{source}":
        return {200}
    if not source_configured:
        return {404}
    if method == "OPTIONS":
        return {200, 400, 401, 405}
    return {200, 400, 401, 413, 415, 431}


# As in test_admin_schemathesis.py: schemathesis' pytest integration reads a pytest internal
# that pytest 9 removed, so each operation's strategy is driven with @given directly.
# Positive mode only: these operations constrain nothing a sender could violate (any bytes
# of any content type, a string path segment, no parameters), so negative mode has no case
# to generate; arbitrary headers and bodies are the subject of tests/unit/test_hostile_input.py.
def test_ingest_health_and_metrics_conform_to_their_schema(api: Any) -> None:
    mode = GenerationMode.POSITIVE
    operations = [
        result.ok()
        for result in api.include(
            path_regex="^/(webhooks|healthz|readyz|metrics)"
        ).get_all_operations()
    ]
    names = sorted(f"{op.method.upper()} {op.path}" for op in operations)
    assert names == [
        "GET /healthz",
        "GET /metrics",
        "GET /readyz",
        "OPTIONS /webhooks/{source}",
        "POST /webhooks/{source}",
    ]
    for operation in operations:

        @given(case=operation.as_strategy(mode), source=SOURCE_NAMES)
        @schema_run_settings(MAX_EXAMPLES)
        def check(case: Any, source: str | None) -> None:
            path_parameters = case.path_parameters or {}
            if source is not None and "source" in path_parameters:
                path_parameters["source"] = source
            # Schema-valid deliveries are still refused when unsigned or without an id: that
            # is the point of a verifier, so acceptance is checked below instead.
            response = case.call_and_validate(excluded_checks=[positive_data_acceptance])
            assert response.status_code < 500, response.text
            configured = path_parameters.get("source", "open") in SOURCES
            allowed = expected_statuses(case.method.upper(), case.path, configured)
            assert response.status_code in allowed, (case.path_parameters, response.text)

        check()
