"""`webhook-inbox serve`: database and migrations, then HTTP and processing child processes.

The parent binds the listening socket, starts the embedded PostgreSQL when there is no
`DATABASE_URL`, applies migrations and prints the banner; then it only supervises. HTTP
children (`--workers`) share the socket and run uvicorn; processing children
(`--worker-processes`) each run `webhook-inbox worker`. A handler that blocks, leaks or kills
its process takes no HTTP process with it, and the supervisor starts it again.

On Linux the children are forks of the supervisor, which imports what they run beforehand
(`preload_children`). It imports no handler module itself: each child imports them afresh
(a restarted one as they are on disk then), and shares no connection or thread that a module
opens on import. A forked child checks them before anything starts (`check_children_config`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from service.api.head_limits import MAX_REQUEST_HEAD_BYTES
from service.core.admin_tokens import ensure_admin_tokens
from service.core.db import EmbeddedPostgres, create_engine, describe_url
from service.core.metrics import MULTIPROCESS_ENV
from service.core.migrations import upgrade
from service.core.settings import ConfigError, Settings
from service.sources.config_file import InboxConfig
from service.store.errors import is_lock_timeout, translate_errors
from service.supervisor import Role, Supervisor, can_fork, fork

log = logging.getLogger("service.serve")

# What the supervisor hands its children in the environment.
LISTEN_FD_ENV = "INBOX_LISTEN_FD"
PROCESSING_STATE_ENV = "INBOX_PROCESSING_STATE"

# uvicorn's graceful shutdown: in-flight requests get this long after SIGTERM.
HTTP_GRACE_SECONDS = 30.0

# What the children run, imported by the supervisor before it forks them: a child then starts
# in about 0.1 s of CPU instead of the 1-1.5 s an interpreter importing them again takes.
CHILD_MODULES = (
    "uvicorn",
    "uvloop",
    "service.app",
    "service.api.http_protocol",
    "service.worker.runtime",
    "service.worker.worker",
    "service.worker_command",
)


def child_title(role: str) -> str:
    """What `ps` shows for a forked child of `role` (docs/operating.md)."""
    return f"webhook-inbox serve: {role}"


def banner(settings: Settings, inbox: InboxConfig, host: str, port: int) -> str:
    base = f"http://{host}:{port}"
    tokens, token_file = ensure_admin_tokens(settings)
    lines = [
        f"webhook-inbox serving on {base} (API docs: {base}/docs)",
        f"console: {base}/console/ (sign in with an admin token)",
    ]
    if token_file is not None:
        lines += [
            f"admin token: {tokens[0]}",
            f"  (generated on first start, stored in {token_file}; read it with: cat {token_file})",
        ]
    else:
        lines.append("admin tokens: from INBOX_ADMIN_TOKENS")
    lines.append(f"sources: {', '.join(inbox.sources) or 'none (set INBOX_CONFIG)'}")
    if inbox.endpoints:
        lines.append(f"outbox endpoints: {', '.join(inbox.endpoints)}")
    for source in inbox.sources.values():
        example = source.example_curl(base)
        if example:
            lines += [
                f"send a signed delivery to '{source.name}' (repeat it: a duplicate):",
                example,
            ]
            break
    return "\n".join(lines)


# A migration's wait for a lock on a table is cut at this (alembic/env.py sets lock_timeout
# once it holds the migration lock), and `migrate` tries again after RETRY_PAUSE_SECONDS.
# While a DDL statement waits behind a transaction that uses its table (a batch of handlers,
# a long admin query), every later statement on that table queues behind it: ingest would
# stand still for as long. Cut short and tried again, it stalls ingest for at most this long
# each time. Each try rolls back whole: PostgreSQL's DDL is transactional.
TABLE_LOCK_WAIT = "2s"
RETRY_PAUSE_SECONDS = 3.0


async def migrate(url: str, settings: Settings) -> None:
    """Apply the migrations; a database that cannot be reached raises `StoreUnavailable`.

    No statement of theirs is cut short: building an index over a large inbox takes as long
    as it takes, and a start that gave up on it half-way would fail every time. Only a wait
    for a busy table's lock is (TABLE_LOCK_WAIT), and then the migrations are tried again,
    for as long as it takes.
    """
    engine = create_engine(url, settings, bounded_statements=False)
    try:
        tries = 0
        while True:
            try:
                async with translate_errors():
                    await upgrade(engine, table_lock_wait=TABLE_LOCK_WAIT)
                return
            except Exception as exc:
                if not is_lock_timeout(exc):
                    raise
            tries += 1
            log.warning(
                "migration waited %s for a table another transaction holds; trying again",
                TABLE_LOCK_WAIT,
                extra={"tries": tries, "pause_seconds": RETRY_PAUSE_SECONDS},
            )
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
    finally:
        await engine.dispose()


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket every HTTP child accepts on (bound here, so a restarted child finds it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


def check_children_config() -> None:
    """Exit at once, as a child would at its start (1, one line), when a handler does not import
    or OTEL_* is wrong. Where children are forked, a forked child checks, so that the
    supervisor itself imports no handler module and starts no exporter thread."""
    from service.startup import load

    def check() -> None:
        load(role="supervisor")

    if not can_fork():
        check()
        return
    if (code := fork(check, child_title("check"), os.environ).wait()) != 0:
        raise SystemExit(code)


def preload_children() -> None:
    """Import `CHILD_MODULES` here, once, for every child forked from now on."""
    for name in CHILD_MODULES:
        with contextlib.suppress(ImportError):  # uvloop and httptools are optional
            importlib.import_module(name)
    # Keep the collector off what is imported: a collection would write to every object's
    # header, and so copy the pages each child shares with this process.
    gc.freeze()


def serve(args: argparse.Namespace, settings: Settings, inbox: InboxConfig) -> None:
    """Run `serve` until SIGTERM, SIGINT or SIGHUP; every child drains before it returns."""
    check_children_config()
    if consumer_processes(args, inbox):
        from service.consumers.command import broker_sources, client_factories

        try:
            client_factories(broker_sources(inbox.sources))
        except ConfigError as exc:
            raise SystemExit(f"config error: {exc}") from None
    for source, warning in inbox.warnings().items():
        log.warning(warning, extra={"source": source})
    embedded = None if settings.database_url else EmbeddedPostgres.start(settings.data_dir)
    url = settings.database_url or (embedded.url if embedded else "")
    state_dir = Path(tempfile.mkdtemp(prefix="webhook-inbox-"))
    sock: socket.socket | None = None
    try:
        log.info("database", extra={"url": describe_url(url)})
        settings = settings.model_copy(update={"database_url": url})
        if not args.no_migrate:
            asyncio.run(migrate(url, settings))
        host = args.host or settings.host
        port = args.port or settings.port
        sock = listening_socket(host, port)
        print(banner(settings, inbox, host, port), flush=True)
        processes = 0 if args.no_worker else args.worker_processes
        python = [sys.executable, "-m"]
        roles = [
            Role(
                "http",
                [*python, "service.serve"],
                args.workers,
                (sock.fileno(),),
                run=run_http_child,
                title=child_title("http"),
            ),
            Role(
                "processing",
                [*python, "service", "worker"],
                processes,
                run=run_processing_child,
                title=child_title("processing"),
            ),
            Role(
                "consumer",
                [*python, "service", "consume"],
                consumer_processes(args, inbox),
                run=run_consumer_child,
                title=child_title("consumer"),
            ),
        ]
        state = state_dir / "children.json"
        shared_metrics = state_dir / "metrics"
        shared_metrics.mkdir()
        env = {
            **os.environ,
            # Children read their settings from the environment: the same database, and the
            # embedded server's URL when that is what runs.
            "DATABASE_URL": url,
            LISTEN_FD_ENV: str(sock.fileno()),
            PROCESSING_STATE_ENV: str(state),
            MULTIPROCESS_ENV: str(shared_metrics),
        }
        stop_timeout = max(HTTP_GRACE_SECONDS, settings.worker_grace_seconds) + 15
        if can_fork():
            preload_children()
        Supervisor(roles, env, state, stop_timeout=stop_timeout).run()
    finally:
        if sock is not None:
            sock.close()
        shutil.rmtree(state_dir, ignore_errors=True)
        if embedded is not None:
            embedded.stop()
    log.info("stopped")


def http_protocol() -> Any:
    """uvicorn's HTTP implementation: httptools (faster) with our head bound, else h11."""
    try:
        from service.api.http_protocol import BoundedHttpToolsProtocol
    except ImportError:  # httptools is not installed
        return "h11"
    return BoundedHttpToolsProtocol


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    return {
        "log_config": None,
        "access_log": False,
        "timeout_keep_alive": 5,
        # Requests in progress at once; beyond it, 503 with Retry-After. At this many open
        # connections, the one waiting longest for a request is closed to make room, so idle
        # sockets never refuse a sender (service/api/http_protocol.py; h11 counts them all).
        "limit_concurrency": settings.max_connections,
        # Request heads larger than this are refused: by h11 itself, or by our subclass of
        # the httptools protocol, since httptools has no bound of its own (431, then close);
        # the subclass also closes a connection whose head is not complete within 10 s.
        "http": http_protocol(),
        "h11_max_incomplete_event_size": MAX_REQUEST_HEAD_BYTES,
        "timeout_graceful_shutdown": HTTP_GRACE_SECONDS,
        # No `Server: uvicorn` on every answer: a receiver facing the open internet need not
        # name its software and version family to every sender and scanner (OWASP's HTTP
        # headers guidance); `Date` stays, as RFC 9110 asks of an origin server with a clock.
        "server_header": False,
    }


def run_http_child() -> None:
    """One HTTP child: uvicorn serving the app on the supervisor's socket until SIGTERM."""
    import uvicorn

    from service.app import create_app
    from service.core.collector import settle_collector
    from service.core.metrics import follow_multiprocess_environment
    from service.startup import load

    follow_multiprocess_environment()
    settings, inbox, _ = load(role="http")
    sock = socket.socket(fileno=int(os.environ[LISTEN_FD_ENV]))
    state = os.environ.get(PROCESSING_STATE_ENV)
    app = create_app(settings, inbox, processing_state=Path(state) if state else None)
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(settings)))
    settle_collector()
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


def consumer_processes(args: argparse.Namespace, inbox: InboxConfig) -> int:
    """`--consumer-processes`, by default one when a broker source is configured."""
    from service.sources.brokers import BrokerSource

    if args.consumer_processes is not None:
        return int(args.consumer_processes)
    return int(any(isinstance(s, BrokerSource) for s in inbox.sources.values()))


def run_consumer_child() -> None:
    """One consumer child: `webhook-inbox consume` until SIGTERM."""
    from service.commands.outcome import CommandError, exit_with
    from service.consumers.command import run_consume_command
    from service.core.metrics import follow_multiprocess_environment

    follow_multiprocess_environment()
    try:
        run_consume_command()
    except CommandError as exc:
        exit_with(exc, "consume")


def run_processing_child() -> None:
    """One processing child: `webhook-inbox worker` until SIGTERM."""
    from service.commands.outcome import CommandError, exit_with
    from service.core.metrics import follow_multiprocess_environment
    from service.worker_command import run_worker_command

    follow_multiprocess_environment()
    try:
        run_worker_command()
    except CommandError as exc:
        exit_with(exc, "worker")


if __name__ == "__main__":
    run_http_child()
