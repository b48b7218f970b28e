"""Alembic, driven from code: upgrade, downgrade and "is the schema at head" over our engine.

Alembic is imported where it is used: with Mako and Pygments it is about 110 modules, which an
HTTP process that never runs a migration would load at every start (0.25 s of CPU, 8 MB).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

ROOT = Path(__file__).resolve().parents[2]
# The advisory lock every migration holds (alembic/env.py): a fixed key of our own.
MIGRATION_LOCK = 0x7765_6268_6F6F_6B21  # "webhook!"


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "alembic"))
    return config


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


class Revisions(NamedTuple):
    head: str | None
    known: frozenset[str]  # every revision this release has a migration for


def known_revisions(script: ScriptDirectory) -> frozenset[str]:
    return frozenset(r.revision for r in script.walk_revisions())


def revisions() -> Revisions:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    return Revisions(script.get_current_head(), known_revisions(script))


class SchemaAhead(Exception):
    """The database is at a revision this release has no migration for: a newer release
    migrated it (a rollback, or an older replica started beside a newer one)."""

    def __init__(self, revision: str, head: str | None) -> None:
        super().__init__(
            f"the database's schema is at revision {revision}, which this release does not "
            f"know (its newest is {head}): a newer release migrated it; run that release, or "
            "downgrade the schema with it first"
        )
        self.revision = revision


def refuse_unknown_revisions(migration: MigrationContext, script: ScriptDirectory) -> None:
    """`SchemaAhead` when the database is at a revision `script` has no migration for (run by
    alembic/env.py under the migration lock, before any migration)."""
    unknown = set(migration.get_current_heads()) - known_revisions(script)
    if unknown:
        raise SchemaAhead(min(unknown), script.get_current_head())


async def upgrade(
    engine: AsyncEngine, revision: str = "head", *, table_lock_wait: str | None = None
) -> None:
    """Apply migrations up to `revision` over a connection of `engine`; `SchemaAhead` when
    the database is already past what this release knows. With `table_lock_wait` (a duration
    as `lock_timeout` takes it), each wait for a table's lock fails after that long, and the
    whole upgrade rolls back (see `service.serve.migrate`)."""

    def run(connection: Connection) -> None:
        from alembic import command

        config = alembic_config()
        config.attributes["connection"] = connection
        config.attributes["table_lock_wait"] = table_lock_wait
        command.upgrade(config, revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    def run(connection: Connection) -> None:
        from alembic import command

        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)


async def current_revision(engine: AsyncEngine) -> str | None:
    def read(connection: Connection) -> str | None:
        from alembic.runtime.migration import MigrationContext

        return MigrationContext.configure(connection).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def has_inbox_tables(engine: AsyncEngine) -> bool:
    """Whether any migration has run here (`inbox_messages` exists), without loading Alembic."""
    async with engine.connect() as conn:
        found = await conn.scalar(text("SELECT to_regclass('inbox_messages') IS NOT NULL"))
    return bool(found)
