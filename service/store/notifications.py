"""LISTEN on the channel ingest notifies, over a dedicated connection that reconnects itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, NoReturn

import asyncpg
from sqlalchemy import text

from service.core.db import asyncpg_dsn

log = logging.getLogger("service.worker.listener")

# Ingest notifies this channel when it records messages for a worker to run.
NOTIFY_CHANNEL = "webhook_inbox"
NOTIFY = text(f"SELECT pg_notify('{NOTIFY_CHANNEL}', :source)")

# The listener's connection is named so that it can be found in pg_stat_activity.
LISTENER_APPLICATION_NAME = "webhook-inbox-listener"
COUNT_LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
    " AND datname = current_database()"
)

HEALTH_CHECK_SECONDS = 15.0
MAX_RECONNECT_DELAY_SECONDS = 30.0


async def listen_for_messages(
    url: str, on_notify: Callable[[], None], application_name: str = LISTENER_APPLICATION_NAME
) -> NoReturn:
    """Call `on_notify` for each notification on `webhook_inbox`, forever.

    `application_name` names the connection; the workers' own name is what
    `wait_for_listeners` counts, so a listener of another kind (`tail`) names itself apart.

    A lost connection is reopened with backoff; `on_notify` is also called on every (re)connect,
    since notifications sent while nobody listened are gone. Polling covers the gap meanwhile.
    """
    delay = 0.5

    def callback(*_: Any) -> None:
        on_notify()

    while True:
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(
                asyncpg_dsn(url),
                timeout=10,
                server_settings={"application_name": application_name},
            )
            await conn.add_listener(NOTIFY_CHANNEL, callback)
            log.info("listening", extra={"channel": NOTIFY_CHANNEL})
            delay = 0.5
            on_notify()
            while True:
                # Notifications arrive on their own; this only notices a silently dead socket.
                await asyncio.sleep(HEALTH_CHECK_SECONDS)
                await conn.execute("SELECT 1", timeout=10)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning(
                "listener connection lost; polling until it is back",
                extra={"error": f"{type(exc).__name__}: {exc}", "retry_in_s": delay},
            )
        finally:
            if conn is not None:
                conn.terminate()
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RECONNECT_DELAY_SECONDS)


async def wait_for_listeners(conn: asyncpg.Connection, count: int, interval: float = 0.05) -> None:
    """Until `count` workers' listeners are connected to `conn`'s database, so that a NOTIFY
    reaches them all: for what starts worker processes and then counts on them (the
    benchmarks, the end-to-end tests), under their own `asyncio.timeout`."""
    while True:
        if await conn.fetchval(COUNT_LISTENERS, LISTENER_APPLICATION_NAME) >= count:
            return
        await asyncio.sleep(interval)
