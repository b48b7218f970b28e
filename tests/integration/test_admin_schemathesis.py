"""Property-based run of the admin OpenAPI with a valid token: no 5xx, every answer as documented.

schemathesis drives the real app (lifespan started, engine on a real database) over ASGI; the
database is seeded so listings, details and retries return real rows, not only 404s.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import schemathesis
from hypothesis import given
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.app import create_app
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from tests.admin_seed import AUTH, CONFIG, TOKEN, seed, seed_attempt
from tests.schema_runs import schema_run_settings

MAX_EXAMPLES = 20


@pytest.fixture
async def seeded(db: asyncpg.Connection) -> None:
    statuses = ["pending", "processing", "processed", "retrying", "dead", "discarded"]
    for i in range(12):
        row = await seed(
            db,
            f"m-{i}",
            source="hooks" if i % 2 else "other",
            status=statuses[i % len(statuses)],
            event_type="order.created" if i % 3 else None,
            age=timedelta(hours=i),
            body=b'{"n": 1}' if i % 4 else b"\x00binary",
            content_type="application/json" if i % 4 else None,
        )
        await seed_attempt(db, row, 1, "retrying", error="boom")
    await db.execute(
        "INSERT INTO inbox_rejected_deliveries "
        "(source, received_at, status, reason, detail, size, headers) "
        "VALUES ('hooks', now(), 401, 'unauthenticated', 'token does not match', 2, "
        """'{"x-message-id": "m-0"}')"""
    )


@pytest.fixture
def admin_api(database_url: str, data_dir: Path, seeded: None) -> Any:
    app = create_app(
        Settings(database_url=database_url, data_dir=data_dir, admin_tokens=[TOKEN]),
        parse_inbox_config(CONFIG),
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


SEARCH_FIELDS = ("q", "contains", "where", "header")


def refused_search(detail: str) -> bool:
    """Whether a 422's detail refuses only the search fields' contents."""
    return all(
        part.split(".", 1)[-1].split(":", 1)[0].split("[", 1)[0] in SEARCH_FIELDS
        for part in detail.split("; ")
    )


# schemathesis' own pytest integration (`from_fixture(...).parametrize()`) reads a pytest
# internal that pytest 9 removed, so each operation's strategy is driven with @given directly.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_admin_api_conforms_to_its_schema(admin_api: Any, mode: GenerationMode) -> None:
    # GET /admin/tail streams until the client leaves, which a call over ASGI never does
    # (it waits for the whole answer): tests/integration/test_tail.py covers it.
    admin = admin_api.include(path_regex="^/admin/").exclude(path="/admin/tail")
    operations = [result.ok() for result in admin.get_all_operations()]
    assert len(operations) == 27
    for operation in operations:

        @given(case=operation.as_strategy(mode))
        @schema_run_settings(MAX_EXAMPLES)
        def check(case: Any) -> None:
            # A schema-valid cursor is still refused (400) unless we signed it; that is the one
            # schema-valid request the API may reject, so it is checked here instead.
            # A case whose headers were made invalid (the token missing or malformed) is sent
            # as made: putting our token back could leave a valid request, which schemathesis
            # would then report as wrongly accepted.
            header = (case.meta.components if case.meta else {}).get(ParameterLocation.HEADER)
            headers = {} if header and header.mode.is_negative else AUTH
            response = case.call_and_validate(
                headers=headers, excluded_checks=[positive_data_acceptance]
            )
            if mode is GenerationMode.POSITIVE:
                if response.status_code == 400:
                    assert "cursor" in (case.query or {})
                    assert "cursor" in response.json()["detail"]
                elif response.status_code == 422 and refused_search(response.json()["detail"]):
                    # The search fields are JSON text and a small grammar (path=value, `Name:
                    # value`) that a schema's string cannot spell out: a well-typed one may
                    # still be refused, only by what it says of them.
                    pass
                else:
                    assert response.status_code < 400 or response.status_code in (404, 409)

        check()
