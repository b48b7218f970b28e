"""`webhook-inbox db-url`: the inbox database's URL, for a handler author's own migrations."""

from __future__ import annotations

import argparse

from service.commands.outcome import CommandError, Exit
from service.commands.parsers import command_parser

DESCRIPTION = """
Print the URL of the database the inbox uses, for your handlers' own tables: by default as
postgresql://..., which psql, pg_dump, psycopg and asyncpg.connect take; with --sqlalchemy as
SQLAlchemy's asyncpg URL (postgresql+asyncpg://...), which Alembic's async template
(`alembic init -t async`) and create_async_engine take. It is DATABASE_URL when that is set,
else the embedded PostgreSQL's, which exists only while `serve` runs (under INBOX_DATA_DIR,
default .inbox). The URL carries the password, if the database has one.
"""

EPILOG = "Exit status: 0 printed, 2 usage or configuration error, 3 no database running."


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = command_parser(
        commands,
        "db-url",
        help="print the inbox database's URL, for your own migrations",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    command.add_argument(
        "--sqlalchemy",
        action="store_true",
        help="postgresql+asyncpg://... (SQLAlchemy, Alembic) instead of postgresql://...",
    )
    # The default's old name, from when the SQLAlchemy form was the default: scripts that pass
    # it still get the postgresql:// form they asked for.
    command.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    command.set_defaults(run=run)


def run(args: argparse.Namespace) -> Exit:
    # Imported here, not with the parser: `webhook-inbox --help` needs no SQLAlchemy.
    from service.commands.database import (
        has_embedded_data,
        operator_settings,
        pgdata_of,
        running_embedded_url,
    )
    from service.core.db import async_url, asyncpg_dsn

    settings = operator_settings()
    url = settings.database_url or running_embedded_url(settings)
    if url is None:
        where = pgdata_of(settings)
        state = "is not running" if has_embedded_data(settings) else "does not exist"
        raise CommandError(
            f"DATABASE_URL is unset and the embedded PostgreSQL under {where} {state}: start "
            "`webhook-inbox serve` (or `make run`) in this directory first; its URL holds only "
            "while it runs",
            Exit.UNAVAILABLE,
        )
    try:
        print(async_url(url) if args.sqlalchemy else asyncpg_dsn(url))
    except ValueError as exc:
        raise CommandError(f"config error: {exc}", Exit.USAGE) from None
    return Exit.OK
