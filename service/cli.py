"""The `webhook-inbox` command: serve, worker, migrate, prune."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.core.config import (
    MAX_REQUEST_HEAD_BYTES,
    ConfigError,
    Settings,
    format_validation_error,
)
from service.core.db import create_engine, database_url, describe_url
from service.core.logging import configure_logging
from service.core.migrations import upgrade
from service.core.security import ensure_admin_tokens
from service.inbox_config import InboxConfig, load_inbox_config
from service.processing.pipeline import Pipeline, resolve_pipelines
from service.retention import PruneReport, prune

log = logging.getLogger("service.cli")

EPILOG = """
Environment: DATABASE_URL (unset: an embedded PostgreSQL under INBOX_DATA_DIR), INBOX_CONFIG
(default inbox.toml), INBOX_DATA_DIR (default .inbox), INBOX_ADMIN_TOKENS (comma-separated),
INBOX_HOST, INBOX_PORT, INBOX_MAX_BODY_BYTES, INBOX_LOG_LEVEL, INBOX_LOG_FORMAT (json|text).
"""

WORKER_DESCRIPTION = """
Run the worker alone: claim accepted messages (woken by LISTEN/NOTIFY, polling as a fallback),
run their handlers or forward them, retry failures with backoff, dead-letter the rest. Any number
of workers (and `serve` processes) may run against one database; a message's handlers never run
twice at once. SIGTERM or SIGINT stops claiming and lets in-flight batches finish within the
grace period.
"""

WORKER_EPILOG = (
    EPILOG
    + """Worker settings: INBOX_WORKER_CONCURRENCY (default 4), INBOX_WORKER_BATCH_SIZE (100),
INBOX_WORKER_POLL_SECONDS (2), INBOX_WORKER_GRACE_SECONDS (30),
INBOX_WORKER_LEASE_MARGIN_SECONDS (30); the options below override them.
"""
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="webhook-inbox",
        description="Receive webhooks and push deliveries exactly once.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the HTTP API (and, by default, the worker)",
        description="Run the HTTP API and, unless --no-worker, the worker, in this process.",
        epilog=EPILOG,
    )
    serve.add_argument("--host", help="address to bind (default: INBOX_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: INBOX_PORT or 8000)")
    serve.add_argument(
        "--workers", type=int, default=1, help="number of server processes (default 1)"
    )
    serve.add_argument(
        "--no-worker", action="store_true", help="serve HTTP only; run `worker` elsewhere"
    )
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")

    worker = commands.add_parser(
        "worker",
        help="run the worker alone (no HTTP)",
        description=WORKER_DESCRIPTION,
        epilog=WORKER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("--concurrency", type=int, help="claim loops run at once")
    worker.add_argument("--batch-size", type=int, help="messages claimed per transaction")
    worker.add_argument("--poll-seconds", type=float, help="polling fallback period")
    worker.add_argument(
        "--grace-seconds", type=float, help="how long in-flight batches may finish at shutdown"
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
    return parser


def load(
    settings_only: bool = False, **overrides: Any
) -> tuple[Settings, InboxConfig, dict[str, Pipeline]]:
    """Settings, sources and their imported handlers, or exit 2 with one line naming the fault."""
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise SystemExit(f"config error: {format_validation_error('env', exc)}") from None
    configure_logging(settings.log_level, settings.log_format)
    if settings_only:
        return settings, InboxConfig(), {}
    try:
        inbox = load_inbox_config(Path(settings.config), required=settings.config_is_set)
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    try:
        pipelines = resolve_pipelines(inbox)
    except ConfigError as exc:
        raise SystemExit(f"config error: {settings.config}: {exc}") from None
    return settings, inbox, pipelines


async def migrate(url: str, settings: Settings) -> None:
    engine = create_engine(url, settings)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


async def prune_once(url: str, settings: Settings, inbox: InboxConfig) -> PruneReport:
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


def banner(settings: Settings, inbox: InboxConfig, host: str, port: int) -> str:
    base = f"http://{host}:{port}"
    tokens, token_file = ensure_admin_tokens(settings)
    lines = [f"webhook-inbox serving on {base} (API docs: {base}/docs)"]
    if token_file is not None:
        lines += [
            f"admin token: {tokens[0]}",
            f"  (generated on first start, stored in {token_file}; read it with: cat {token_file})",
        ]
    else:
        lines.append("admin tokens: from INBOX_ADMIN_TOKENS")
    lines.append(f"sources: {', '.join(inbox.sources) or 'none (set INBOX_CONFIG)'}")
    for source in inbox.sources.values():
        example = source.example_curl(base)
        if example:
            lines += [
                f"send a signed delivery to '{source.name}' (repeat it: a duplicate):",
                example,
            ]
            break
    return "\n".join(lines)


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from service.app import RUN_WORKER_ENV, create_app

    settings, inbox, _ = load()
    url = database_url(settings)
    log.info("database", extra={"url": describe_url(url)})
    # Server processes started by uvicorn read their settings from the environment.
    os.environ["DATABASE_URL"] = url
    settings = settings.model_copy(update={"database_url": url})
    if not args.no_migrate:
        asyncio.run(migrate(url, settings))
    host = args.host or settings.host
    port = args.port or settings.port
    print(banner(settings, inbox, host, port), flush=True)
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_config": None,
        "access_log": False,
        "timeout_keep_alive": 5,
        # Requests in progress at once; beyond it, 503 with Retry-After. At this many open
        # connections, the one waiting longest for a request is closed to make room, so idle
        # sockets never refuse a sender (service/core/http_protocol.py; h11 counts them all).
        "limit_concurrency": settings.max_connections,
        # Request heads larger than this are refused: by h11 itself, or by our subclass of
        # the httptools protocol, since httptools has no bound of its own (431, then close);
        # the subclass also closes a connection whose head is not complete within 10 s.
        "http": http_protocol(),
        "h11_max_incomplete_event_size": MAX_REQUEST_HEAD_BYTES,
        "timeout_graceful_shutdown": 30,
    }
    run_worker = not args.no_worker
    if args.workers > 1:
        os.environ[RUN_WORKER_ENV] = "1" if run_worker else "0"
        uvicorn.run(
            "service.app:create_app_from_env", factory=True, workers=args.workers, **options
        )
    else:
        app = create_app(
            settings, inbox, run_worker_in_process=run_worker, exit_on_worker_crash=True
        )
        uvicorn.run(app, **options)


def http_protocol() -> Any:
    """uvicorn's HTTP implementation: httptools (faster) with our head bound, else h11."""
    try:
        from service.core.http_protocol import BoundedHttpToolsProtocol
    except ImportError:  # httptools is not installed
        return "h11"
    return BoundedHttpToolsProtocol


def worker(args: argparse.Namespace) -> None:
    from service.worker import WorkerCrashed, run_worker

    settings, inbox, pipelines = load(
        worker_concurrency=args.concurrency,
        worker_batch_size=args.batch_size,
        worker_poll_seconds=args.poll_seconds,
        worker_grace_seconds=args.grace_seconds,
    )
    url = database_url(settings)
    log.info("database", extra={"url": describe_url(url)})

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_worker(settings, url, pipelines, stop, retention=inbox)

    try:
        asyncio.run(run())
    except WorkerCrashed as exc:
        log.critical("worker crashed", extra={"error": str(exc)})
        sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)
    elif args.command == "worker":
        worker(args)
    elif args.command == "migrate":
        settings, _, _ = load(settings_only=True)
        url = database_url(settings)
        asyncio.run(migrate(url, settings))
        print(f"migrated {describe_url(url)} to head")
    elif args.command == "prune":
        settings, inbox, _ = load()
        url = database_url(settings)
        print(describe_prune(asyncio.run(prune_once(url, settings, inbox))))
    else:  # pragma: no cover - argparse refuses unknown commands
        sys.exit(2)


if __name__ == "__main__":
    main()
