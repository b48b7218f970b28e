"""bench/ingest: the service's ingest against three baselines under wrk, with targets checked.

Run `bench/ingest` (or `bench/ingest --quick`); see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import report
from bench.load import MODES, LoadResult, ensure_wrk, run_cell_load, run_wrk, write_requests
from bench.pg import BenchPostgres, add_recycled_wal_argument, connected, recycled_wal
from bench.servers import Server, process_tree, tree_cpu_seconds
from bench.systems import (
    RESULTS_DIR,
    Cell,
    Process,
    Target,
    build_processes,
)

# What `--systems` chooses from (bench/systems.py builds them).
SYSTEMS = (
    "generic",
    "generic-serve",
    "standard-webhooks",
    "baseline-A",
    "baseline-B",
    "baseline-F",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/ingest",
        description="Benchmark POST /webhooks/{source} against a no-database FastAPI baseline, "
        "a naive SQLModel receiver and the HTTP floor (httptools, no framework), on PostgreSQL "
        "(DATABASE_URL, else embedded).",
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per cell (10)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds (3: a median that one slow cell cannot move)",
    )
    parser.add_argument("--connections", default="32,128", help="wrk connections (32,128)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (2)")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of warm-up per start")
    parser.add_argument(
        "--max-rps",
        type=int,
        default=24000,
        help="requests pre-generated per second of a cell; a cell that runs out is invalid "
        "(24000: this 2-core machine has served 15,000)",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="the service's INBOX_LOG_LEVEL (INFO, as deployed)"
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of the systems to run ({', '.join(SYSTEMS)})",
    )
    parser.add_argument(
        "--ids",
        default=",".join(MODES),
        help="comma-separated id modes of the cells: unique (every id new), dup50 (half the "
        "requests repeat an earlier one); with --profile, the modes profiled (unique,dup50)",
    )
    add_recycled_wal_argument(parser, "cells")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 round of 3 s cells, 1 s warm-up"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the benchmark, run the service's cells under py-spy and print "
        "where its time goes (needs py-spy on PATH or in .venv)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.warmup = 3, 1, 1
    args.connections = [int(c) for c in args.connections.split(",")]
    args.systems = args.systems.split(",")
    unknown = [name for name in args.systems if name not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system {', '.join(unknown)}: choose from {', '.join(SYSTEMS)}")
    args.ids = args.ids.split(",")
    unknown = [mode for mode in args.ids if mode not in MODES]
    if unknown:
        parser.error(f"unknown id mode {', '.join(unknown)}: choose from {', '.join(MODES)}")
    return args


async def fetch_ids(url: str, table: str, source: str) -> set[str]:
    async with connected(url) as conn:
        rows = await conn.fetch(f"SELECT message_id FROM {table} WHERE source = $1", source)
    return {r["message_id"] for r in rows}


async def truncate(url: str, table: str) -> None:
    async with connected(url) as conn:
        await conn.execute(f"TRUNCATE {table} CASCADE")


def check_stored(result: LoadResult, process: Process, target: Target) -> dict[str, Any]:
    """Every id answered 2xx is in the table, and no id was `accepted` twice."""
    if target.table is None or process.database_url is None:
        return {"checked": False}
    stored = asyncio.run(fetch_ids(process.database_url, target.table, target.source))
    missing = sorted(result.acked_ids - stored)
    ok = (
        not missing
        and not result.accepted_twice
        and result.log_complete
        and result.logged == result.acked  # every 2xx named its message id
        and result.outcomes.get("accepted", 0) <= len(stored)
    )
    return {
        "checked": True,
        "ok": ok,
        "acked_ids": len(result.acked_ids),
        "stored_rows": len(stored),
        "missing": len(missing),
        "missing_sample": missing[:5],
        "accepted_twice_sample": result.accepted_twice[:5],
    }


def rotate(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return items[by:] + items[:by]


@dataclass
class Run:
    """What every round and cell of one bench/ingest run shares."""

    args: argparse.Namespace
    wrk: str
    work: Path
    key: bytes
    cells: dict[tuple[str, int, str], Cell]
    pg: BenchPostgres


def run_round(processes: list[Process], round_no: int, run: Run) -> None:
    """One round: every system's server started (and warmed up) at once, then each cell
    (connections, id mode) run for every system in turn, seconds apart.

    The ratios are what the targets read, and on a shared machine the speed drifts from one
    minute to the next: one system's cells run in a block minutes before another's would
    compare two different machines. Run side by side, each pair of cells sees nearly the same
    one. An idle server costs its neighbours next to nothing; its memory is sampled only
    under its own load."""
    with contextlib.ExitStack() as stack:
        servers = {
            process.name: stack.enter_context(
                Server(
                    process.name,
                    process.command,
                    process.env,
                    run.work / f"{process.name}.log",
                    sample_memory=False,
                )
            )
            for process in processes
        }
        for process in processes:
            warm_up(servers[process.name], process.targets[0], round_no, run)
        targets = [(process, target) for process in processes for target in process.targets]
        for connections in run.args.connections:
            for mode in run.args.ids:
                for process, target in rotate(targets, round_no):
                    srv = servers[process.name]
                    run_cell(srv, process, target, connections, mode, round_no, run)
    for process in processes:
        process.peak_rss.append(servers[process.name].peak_rss)


def warm_up(srv: Server, target: Target, round_no: int, run: Run) -> None:
    args = run.args
    if args.warmup <= 0:
        return
    prefix, body = write_requests(
        run.work / "req", f"warm{round_no}", math.ceil(args.max_rps * args.warmup), 1, run.key
    )
    run_wrk(
        run.wrk,
        srv.url + target.path,
        connections=args.connections[0],
        threads=1,
        duration=args.warmup,
        requests=prefix,
        body_template=body,
        dup_fraction=0.0,
        ack_log=run.work / "ack",
    )


def run_cell(
    srv: Server,
    process: Process,
    target: Target,
    connections: int,
    mode: str,
    round_no: int,
    run: Run,
) -> None:
    args, pg = run.args, run.pg
    per_thread = math.ceil(args.max_rps * args.duration / args.threads)
    if target.table and process.database_url:
        asyncio.run(truncate(process.database_url, target.table))
    tag = f"r{round_no}-{target.name}-c{connections}-{mode}"
    prefix, body = write_requests(run.work / "req", tag, per_thread, args.threads, run.key)
    with srv.sampling_memory():
        cpu_before = tree_cpu_seconds(process_tree(srv.pid))
        pg_before = pg.cpu_seconds()
        result = run_cell_load(
            run.wrk, srv.url + target.path, args, connections, mode, prefix, body, run.work / "ack"
        )
        cpu = tree_cpu_seconds(process_tree(srv.pid)) - cpu_before
        pg_after = pg.cpu_seconds()
    figures = {"round": round_no, **result.summary()}
    # CPU of the server's processes per request: steadier than req/s on a machine whose cores
    # other work shares. The embedded PostgreSQL's apart (the service's backends, and the
    # truncate's, a few milliseconds, if it is reaped after the first read), as what the
    # database spends on each delivery.
    requests = max(result.requests, 1)
    figures["cpu_us_per_request"] = round(cpu / requests * 1e6, 1)
    if pg_before is not None and pg_after is not None and process.database_url:
        figures["pg_cpu_us_per_request"] = round((pg_after - pg_before) / requests * 1e6, 1)
    figures["stored"] = check_stored(result, process, target)
    run.cells[(target.name, connections, mode)].runs.append(figures)
    print(report.progress_line(target.name, connections, mode, figures), flush=True)


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "wrk": wrk_version.split("\n", 1)[0].strip(),
        "loadavg_start": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wrk = ensure_wrk()
    if args.profile:
        from bench import profile

        profile.run(args, wrk)
        return
    info = machine()
    print(f"machine: {info}", flush=True)
    key = secrets.token_bytes(32)
    started = time.time()
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-bench-") as tmp:
        work = Path(tmp)
        info["postgres"] = {"embedded": pg.embedded, **asyncio.run(pg.settings())}
        if args.recycled_wal:
            info["postgres"]["recycled_wal_segments"] = recycled_wal(pg)
        processes = build_processes(pg, work, args, key)
        cells = {
            (t.name, c, m): Cell(t.name, c, m)
            for p in processes
            for t in p.targets
            for c in args.connections
            for m in args.ids
        }
        for round_no in range(args.rounds):
            print(f"round {round_no + 1}/{args.rounds}", flush=True)
            run_round(processes, round_no, Run(args, wrk, work, key, cells, pg))
        for process in processes:
            if process.database_url:
                asyncio.run(pg.drop_database(process.database_url))
    info["loadavg_end"] = os.getloadavg()
    summary = report.summarise(cells, processes, args)
    print()
    print(report.render(summary))
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"ingest-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {
        "machine": info,
        "options": {
            k: getattr(args, k)
            for k in ("duration", "rounds", "connections", "threads", "warmup", "max_rps")
        }
        | {"service_log_level": args.log_level},
        "elapsed_s": round(time.time() - started, 1),
        "cells": [vars(c) for c in cells.values()],
        "peak_rss_bytes": {p.name: max(p.peak_rss, default=0) for p in processes},
        "summary": summary,
    }
    out.write_text(json.dumps(document, indent=2, default=str))
    print(f"\nresults: {out}")
    # Missed speed targets are reported above; a lost acknowledged id is a bug: fail.
    if not summary["all_stored"]:
        sys.exit(2)


if __name__ == "__main__":
    main()
