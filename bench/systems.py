"""The systems bench/ingest runs (the service and its baselines), shared with --profile and
bench/report, so that none of them imports another's entry point."""

from __future__ import annotations

import argparse
import asyncio
import base64
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.pg import BenchPostgres

RESULTS_DIR = Path(__file__).with_name("results")


@dataclass(frozen=True)
class Target:
    """One system under load: an endpoint of a process, and where its acknowledged ids go."""

    name: str
    path: str
    table: str | None = None  # None: nothing to check (baseline A stores nothing)
    source: str = "generic"


@dataclass
class Process:
    """One uvicorn process serving one or more targets."""

    name: str
    command: list[str]
    env: dict[str, str]
    targets: list[Target]
    database_url: str | None = None
    peak_rss: list[int] = field(default_factory=list)


@dataclass
class Cell:
    target: str
    connections: int
    mode: str
    runs: list[dict[str, Any]] = field(default_factory=list)


def console_script(name: str) -> list[str]:
    script = Path(sys.executable).with_name(name)
    return [str(script)] if script.exists() else [sys.executable, "-m", "service"]


SOURCES_TOML = """
# bench/ingest: one generic source (id from a header, no signature) and one standard-webhooks
# source (whsec_ secret, default 300 s tolerance: requests are signed just before each cell).
[sources.generic]
kind = "generic"
id_header = "X-Message-Id"

[sources.standard-webhooks]
kind = "standard-webhooks"
secrets = ["{secret}"]
"""


def build_processes(
    pg: BenchPostgres, work: Path, args: argparse.Namespace, key: bytes
) -> list[Process]:
    # The two services run side by side (bench/ingest starts every system of a round at
    # once): each writes a database of its own, so that neither's worker or pruning ever
    # reads the rows of the other's cells.
    service_url = asyncio.run(pg.create_database("bench_service"))
    serve_url = asyncio.run(pg.create_database("bench_serve"))
    naive_url = asyncio.run(pg.create_database("bench_naive"))
    sources = work / "sources.toml"
    secret = "whsec_" + base64.b64encode(key).decode()
    sources.write_text(SOURCES_TOML.replace("{secret}", secret))
    service_env = {
        "DATABASE_URL": service_url,
        "INBOX_CONFIG": str(sources),
        "INBOX_DATA_DIR": str(work / "inbox-data"),
        "INBOX_ADMIN_TOKENS": secrets.token_hex(16),
        "INBOX_LOG_LEVEL": args.log_level,
    }
    serve_env = {**service_env, "DATABASE_URL": serve_url}
    baseline = [sys.executable, "-m", "bench.baselines"]
    processes = [
        Process(
            "service",
            [*console_script("webhook-inbox"), "serve", "--no-migrate", "--no-worker"],
            service_env,
            [
                Target("generic", "/webhooks/generic", "inbox_messages", "generic"),
                Target(
                    "standard-webhooks",
                    "/webhooks/standard-webhooks",
                    "inbox_messages",
                    "standard-webhooks",
                ),
            ],
            service_url,
        ),
        # The default `serve`: the same HTTP process, with a processing process beside it on
        # the same two cores (the handler-less source's messages are stored processed, so it
        # has no message to run, only its polls and pruning).
        Process(
            "service-serve",
            [*console_script("webhook-inbox"), "serve", "--no-migrate"],
            serve_env,
            [Target("generic-serve", "/webhooks/generic", "inbox_messages", "generic")],
            serve_url,
        ),
        Process("baseline-A", [*baseline, "noop"], {}, [Target("baseline-A", "/webhooks/generic")]),
        # The floor: what a request costs below any framework (bench/baselines/floor.py).
        Process(
            "baseline-F", [*baseline, "floor"], {}, [Target("baseline-F", "/webhooks/generic")]
        ),
        Process(
            "baseline-B",
            [*baseline, "naive"],
            {"BENCH_DATABASE_URL": naive_url},
            [Target("baseline-B", "/webhooks/generic", "naive_messages", "generic")],
            naive_url,
        ),
    ]
    for process in processes:
        process.targets = [t for t in process.targets if t.name in args.systems]
    kept = [p for p in processes if p.targets]
    # The databases only left-out systems use (`--systems`): nothing else would drop them.
    unused = {p.database_url for p in processes} - {p.database_url for p in kept}
    for url in sorted(u for u in unused if u):
        asyncio.run(pg.drop_database(url))
    # Only the databases a kept service writes are migrated (--profile keeps one of two).
    for env in (service_env, serve_env):
        if env["DATABASE_URL"] not in unused:
            subprocess.run(
                [*console_script("webhook-inbox"), "migrate"],
                env={**env, "PATH": str(Path(sys.executable).parent)},
                check=True,
                capture_output=True,
            )
    return kept
