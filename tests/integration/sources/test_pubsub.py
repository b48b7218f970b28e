"""The pubsub kind over HTTP on a real database: an OIDC-authenticated push recorded with its
type, its redelivery a duplicate."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from tests.conftest import AppFactory
from tests.integration.sources.rows import only_row_of_a_redelivery, post_twice
from tests.senders.pubsub import bearer, config, oidc, push_body, signing_key


async def test_oidc_push_is_accepted_then_duplicate(
    client_for: AppFactory, db: asyncpg.Connection, tmp_path: Path
) -> None:
    headers = bearer(oidc(signing_key()))
    async with client_for(config(tmp_path)) as client:
        first, again = await post_twice(client, "/webhooks/push", push_body(), headers)
    row = await only_row_of_a_redelivery(db, first, again, "2070443601311540", "order.created")
    assert row["headers"]["authorization"] == "[redacted]"
