"""The `webhook-inbox` command: serve, worker, migrate, prune, and the operator commands."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from service.commands import db_url as db_url_command
from service.commands import inbox as inbox_commands
from service.commands import send as send_command
from service.commands import tail as tail_command
from service.commands.outcome import CommandError, Exit, exit_with, not_migrated
from service.commands.parsers import command_parser
from service.startup import load

# What a command needs is imported when it runs, not here: `--help` and `--version` answer
# at once, and the supervisor and each child pay only for their own role (no admin API in a
# processing process, no worker in `send`).
if TYPE_CHECKING:
    from service.core.settings import Settings
    from service.sources.config_file import InboxConfig
    from service.worker.retention import PruneReport

EPILOG = """
Environment: DATABASE_URL (unset: an embedded PostgreSQL under INBOX_DATA_DIR), INBOX_CONFIG
(default inbox.toml), INBOX_DATA_DIR (default .inbox), INBOX_ADMIN_TOKENS (comma-separated),
INBOX_HOST, INBOX_PORT, INBOX_MAX_BODY_BYTES, INBOX_LOG_LEVEL, INBOX_LOG_FORMAT (json|text).
"""

SERVE_DESCRIPTION = """
Serve the HTTP API (ingest, admin, health, metrics) and run the worker, each in processes of
its own under one supervising process: a handler that blocks, or kills its process, never
stops ingest, and a child that exits is started again (with a growing delay while it keeps
dying). SIGTERM, SIGINT or SIGHUP drains every child (HTTP requests in flight finish, the
worker's batches get INBOX_WORKER_GRACE_SECONDS), then stops the embedded PostgreSQL.
"""

WORKER_DESCRIPTION = """
Run the worker alone: claim accepted messages (woken by LISTEN/NOTIFY, polling as a fallback),
run their handlers or forward them, retry failures with backoff, dead-letter the rest. Any number
of workers (and `serve` processes) may run against one database; a message's handlers never run
twice at once. SIGTERM or SIGINT stops claiming and lets in-flight batches finish within the
grace period.
"""

CONSUME_DESCRIPTION = """
Consume the broker sources (kind rabbitmq, nats or redis-streams) alone: each message is recorded
through the same group commit as an HTTP delivery, and acked on the broker only after its row is
committed (a redelivery is counted and acked as a duplicate). A message that cannot be recorded
(no id, too large) goes to the broker's dead letters. While the database is away nothing is
acked. SIGTERM or SIGINT stops taking messages and settles those held.
"""

WORKER_EPILOG = (
    EPILOG
    + """Worker settings: INBOX_WORKER_CONCURRENCY (default 4), INBOX_WORKER_BATCH_SIZE (100),
INBOX_WORKER_POLL_SECONDS (2), INBOX_WORKER_GRACE_SECONDS (30),
INBOX_WORKER_LEASE_MARGIN_SECONDS (30), INBOX_WORKER_LINGER_SECONDS (0.05),
INBOX_WORKER_NICE (0), INBOX_WORKER_INGEST_CONCURRENCY (half the cores),
INBOX_WORKER_INGEST_QUIET_SECONDS (1); the options below override the first four.
"""
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="webhook-inbox",
        description="Receive webhooks and push deliveries exactly once.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"webhook-inbox {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = command_parser(
        commands,
        "serve",
        help="run the HTTP API and the worker, as supervised processes",
        description=SERVE_DESCRIPTION,
        epilog=EPILOG,
    )
    serve.add_argument("--host", help="address to bind (default: INBOX_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: INBOX_PORT or 8000)")
    serve.add_argument(
        "--workers",
        type=positive,
        default=1,
        metavar="N",
        help="HTTP server processes, as in uvicorn (default 1)",
    )
    serve.add_argument(
        "--worker-processes",
        type=positive,
        default=1,
        metavar="N",
        help="processing processes, each a `webhook-inbox worker` (default 1)",
    )
    serve.add_argument(
        "--no-worker",
        action="store_true",
        help="no processing processes: serve HTTP only, and run `worker` elsewhere",
    )
    serve.add_argument(
        "--consumer-processes",
        type=int,
        metavar="N",
        help="broker consumer processes, each a `webhook-inbox consume` (default 1 when a "
        "broker source is configured, else 0)",
    )
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")

    worker = command_parser(
        commands,
        "worker",
        help="run the worker alone (no HTTP)",
        description=WORKER_DESCRIPTION,
        epilog=WORKER_EPILOG,
    )
    worker.add_argument("--concurrency", type=int, help="claim loops run at once")
    worker.add_argument("--batch-size", type=int, help="messages claimed per transaction")
    worker.add_argument("--poll-seconds", type=float, help="polling fallback period")
    worker.add_argument(
        "--grace-seconds", type=float, help="how long in-flight batches may finish at shutdown"
    )

    command_parser(
        commands,
        "consume",
        help="run the broker consumers alone (no HTTP)",
        description=CONSUME_DESCRIPTION,
        epilog=EPILOG,
    )

    commands.add_parser(
        "migrate",
        help="apply database migrations and exit",
        description="Apply the Alembic migrations up to head, then exit.",
        epilog=EPILOG,
    )
    commands.add_parser(
        "prune",
        help="apply retention now and exit",
        description="Delete processed, discarded (and, with dead_days, dead) rows older than "
        "[retention] allows, never inside a source's redelivery window; print what went.",
        epilog=EPILOG,
    )
    inbox_commands.add_commands(commands)
    send_command.add_command(commands)
    tail_command.add_command(commands)
    db_url_command.add_command(commands)
    return parser


def version() -> str:
    """The installed distribution's version (pyproject.toml's, once synced)."""
    try:
        return importlib.metadata.version("webhook-inbox")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout never installed
        return "unknown"


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


async def prune_once(url: str, settings: Settings, inbox: InboxConfig) -> PruneReport:
    from service.core.db import create_engine
    from service.worker.retention import prune

    engine = create_engine(url, settings)
    try:
        return await prune(engine, inbox)
    finally:
        await engine.dispose()


def describe_prune(report: PruneReport) -> str:
    statuses = " ".join(f"{status}={count}" for status, count in report.by_status.items())
    line = f"pruned {report.total} rows: {statuses}"
    if report.by_source:
        line += " (" + ", ".join(f"{s}={n}" for s, n in sorted(report.by_source.items())) + ")"
    return line


def database_error(settings: Settings, exc: Exception) -> NoReturn:
    """A `CommandError` (exit 3, one line, as the operator commands stop) when the database
    cannot be reached, refuses the login, has no inbox tables, or was migrated by a newer
    release; any other error goes on as it is."""
    from service.core.db import describe_url
    from service.core.migrations import SchemaAhead
    from service.store.errors import StoreUnavailable, is_missing_table, login_refusal

    where = describe_url(settings.database_url) if settings.database_url else "embedded"
    if isinstance(exc, SchemaAhead):
        raise CommandError(str(exc), Exit.UNAVAILABLE) from None
    if is_missing_table(exc):
        raise not_migrated(where) from None
    reason = str(exc) if isinstance(exc, StoreUnavailable) else login_refusal(exc)
    if reason is None:
        raise exc
    raise CommandError(f"database {where} is unavailable: {reason}", Exit.UNAVAILABLE) from None


def serve(args: argparse.Namespace) -> None:
    from service.serve import serve as run

    # The supervisor imports no handler module (it checks them in a child: service/serve.py)
    # and traces nothing: its children are forked from it.
    settings, inbox, _ = load(role="supervisor", handlers=False, tracing=False)
    try:
        run(args, settings, inbox)
    except Exception as exc:
        database_error(settings, exc)


def worker(args: argparse.Namespace) -> None:
    from service.worker_command import run_worker_command

    run_worker_command(
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        poll_seconds=args.poll_seconds,
        grace_seconds=args.grace_seconds,
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        run_command(args)
    except CommandError as exc:
        exit_with(exc, " ".join(filter(None, [args.command, getattr(args, "action", None)])))


def run_command(args: argparse.Namespace) -> None:
    if hasattr(args, "run"):
        sys.exit(args.run(args))
    if args.command == "serve":
        serve(args)
    elif args.command == "worker":
        worker(args)
    elif args.command == "consume":
        from service.consumers.command import run_consume_command

        run_consume_command()
    elif args.command == "migrate":
        from service.core.db import database_url, describe_url
        from service.serve import migrate

        settings, _, _ = load(settings_only=True)
        url = database_url(settings)
        try:
            asyncio.run(migrate(url, settings))
        except Exception as exc:
            database_error(settings, exc)
        print(f"migrated {describe_url(url)} to head")
    elif args.command == "prune":
        from service.core.db import database_url

        settings, inbox, _ = load(lazy_secrets=True)  # retention reads no secret
        url = database_url(settings)
        try:
            report = asyncio.run(prune_once(url, settings, inbox))
        except Exception as exc:
            database_error(settings, exc)
        print(describe_prune(report))
    else:  # pragma: no cover - argparse refuses unknown commands
        sys.exit(2)


if __name__ == "__main__":
    main()
