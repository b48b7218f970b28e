"""The sns kind over HTTP on a real database: a signed notification recorded then a duplicate,
subscription and unsubscribe confirmations answered and not recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest

from service.app import create_app
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from tests.conftest import running
from tests.integration.sources.rows import only_row_of_a_redelivery, post_twice
from tests.senders.sns import (
    CERT_URL,
    CONFIG,
    HEADERS,
    KEY,
    SUBSCRIBE_URL,
    FakeFetcher,
    confirmation,
    notification,
    signed,
    with_fetcher,
)

SnsClient = Callable[[], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def sns_client(database_url: str, data_dir: Path, fetcher: FakeFetcher) -> SnsClient:
    @asynccontextmanager
    async def factory() -> AsyncIterator[httpx.AsyncClient]:
        inbox = parse_inbox_config(CONFIG)
        for source in inbox.sources.values():
            with_fetcher(source, fetcher)
        app = create_app(Settings(database_url=database_url, data_dir=data_dir), inbox)
        async with running(app) as client:
            yield client

    return factory


async def rows(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT * FROM inbox_messages ORDER BY id"))


@pytest.mark.parametrize("version", ["1", "2"])
async def test_signed_notification_is_accepted_then_duplicate(
    sns_client: SnsClient,
    db: asyncpg.Connection,
    fetcher: FakeFetcher,
    version: str,
) -> None:
    body = signed(KEY, notification(), version)
    async with sns_client() as client:
        first, again = await post_twice(client, "/webhooks/alerts", body, HEADERS)
    message_id = "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324"
    await only_row_of_a_redelivery(db, first, again, message_id, "My First Message")
    assert fetcher.certificate_calls == [CERT_URL]  # cached after the first fetch


async def test_subscription_confirmation_is_confirmed_and_not_recorded(
    sns_client: SnsClient, db: asyncpg.Connection, fetcher: FakeFetcher
) -> None:
    headers = {**HEADERS, "x-amz-sns-message-type": "SubscriptionConfirmation"}
    async with sns_client() as client:
        auto = await client.post(
            "/webhooks/alerts", content=signed(KEY, confirmation(), "2"), headers=headers
        )
        manual = await client.post(
            "/webhooks/manual", content=signed(KEY, confirmation(), "2"), headers=headers
        )
    assert auto.status_code == 200
    assert auto.json()["status"] == "confirmed"
    assert manual.json()["status"] == "confirmation_pending"
    assert fetcher.confirm_calls == [SUBSCRIBE_URL]
    assert await rows(db) == []


async def test_unsubscribe_confirmation_is_verified_and_answered(
    sns_client: SnsClient, db: asyncpg.Connection
) -> None:
    body = signed(KEY, confirmation("UnsubscribeConfirmation"))
    async with sns_client() as client:
        response = await client.post("/webhooks/alerts", content=body, headers=HEADERS)
    assert response.status_code == 200
    assert response.json()["status"] == "unsubscribed"
    assert await rows(db) == []
