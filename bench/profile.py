"""bench/ingest --profile: py-spy on the service under wrk, and where its time goes."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.load import run_cell_load, run_wrk, write_requests
from bench.pg import BenchPostgres
from bench.servers import Server
from bench.systems import RESULTS_DIR, Target, build_processes

# "function (path/to/file.py:line)" as py-spy writes a frame with --function.
FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")
PACKAGES = (
    ("service/", "service"),
    ("fastapi/", "fastapi"),
    ("starlette/", "starlette"),
    ("pydantic", "pydantic"),
    ("uvicorn/", "uvicorn"),
    ("asyncpg/", "asyncpg"),
    ("sqlalchemy/", "sqlalchemy"),
    ("logging/", "logging"),
    ("json/", "json"),
    ("asyncio/", "asyncio"),
    ("anyio/", "anyio"),
)
# The targets --profile runs: those of the `serve --no-worker` process.
PROFILED = ("generic", "standard-webhooks")
# Leaves where a thread waits rather than works (py-spy does not always see them as idle):
# the anyio worker threads parked between jobs.
IDLE_LEAVES = frozenset({"Condition.wait (threading.py)", "Queue.get (queue.py)"})


def find_py_spy() -> str:
    candidates = [os.environ.get("PY_SPY"), shutil.which("py-spy")]
    candidates.append(str(Path(sys.executable).with_name("py-spy")))
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit(
        "py-spy not found: install it outside the project's dependencies, e.g.\n"
        "  uv venv /tmp/pyspy && uv pip install --python /tmp/pyspy/bin/python py-spy\n"
        "  PY_SPY=/tmp/pyspy/bin/py-spy bench/ingest --profile"
    )


def package(file: str) -> str:
    return next((name for marker, name in PACKAGES if marker in file), "other")


def analyse(collapsed: Path, top: int = 30) -> str:
    """Self and inclusive time per function, and self time per package, as % of the samples
    in which a thread was working (parked worker threads left out)."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [f for f in stack.split(";") if FRAME.match(f)]
        if not frames:
            continue
        names = []
        for frame in frames:
            match = FRAME.match(frame)
            assert match is not None
            names.append(f"{match['func']} ({short(match['file'])})")
        if names[-1] in IDLE_LEAVES:
            continue
        total += count
        self_time[names[-1]] += count
        leaf = FRAME.match(frames[-1])
        assert leaf is not None
        by_package[package(leaf["file"])] += count
        for name in set(names):
            inclusive[name] += count

    def table(counter: Counter[str], title: str) -> list[str]:
        rows = [f"{title} ({total} busy samples)"]
        # Frames on (nearly) every stack (the server's main, the event loop) say nothing.
        useful = [(name, n) for name, n in counter.most_common() if n < 0.97 * total]
        rows += [f"  {100 * n / total:5.1f}%  {name}" for name, n in useful[:top]]
        return rows

    return "\n".join(
        [
            *table(by_package, "self time by package"),
            "",
            *table(self_time, "self time by function"),
            "",
            *table(inclusive, "inclusive time by function"),
        ]
    )


# Where this checkout is: its own files are named from here.
REPOSITORY = str(Path(__file__).resolve().parent.parent)


def short(file: str) -> str:
    for marker in ("site-packages/", "lib/python3."):
        if marker in file:
            file = file.split(marker, 1)[1]
    return file.removeprefix(f"{REPOSITORY}/")


def run(args: argparse.Namespace, wrk: str) -> None:
    py_spy = find_py_spy()
    connections = args.connections[0]
    key = secrets.token_bytes(32)
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.systems = [s for s in args.systems if s in PROFILED]
    if not args.systems:
        raise SystemExit(
            f"--profile runs the `serve --no-worker` targets: pick {' or '.join(PROFILED)} "
            "with --systems (or leave --systems out for both)"
        )
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-bench-") as tmp:
        work = Path(tmp)
        (service,) = [p for p in build_processes(pg, work, args, key) if p.name == "service"]
        with Server("service", service.command, service.env, work / "service.log") as srv:
            for target in service.targets:
                # Warm up first: the first requests import modules and fill pools.
                prefix, body = write_requests(work / "req", f"warm-{target.name}", 20000, 1, key)
                run_wrk(
                    wrk,
                    srv.url + target.path,
                    connections=connections,
                    threads=1,
                    duration=max(args.warmup, 2),
                    requests=prefix,
                    body_template=body,
                    dup_fraction=0.0,
                    ack_log=work / "ack",
                )
                for mode in args.ids:
                    profile_cell(args, py_spy, srv, target, mode, work, key, stamp, wrk)
        assert service.database_url is not None
        asyncio.run(pg.drop_database(service.database_url))


def profile_cell(
    args: argparse.Namespace,
    py_spy: str,
    srv: Server,
    target: Target,
    mode: str,
    work: Path,
    key: bytes,
    stamp: str,
    wrk: str,
) -> None:
    """One target's cell under py-spy; prints where the HTTP process's time went."""
    connections = args.connections[0]
    per_thread = math.ceil(args.max_rps * args.duration / args.threads)
    prefix, body = write_requests(
        work / "req", f"prof-{target.name}-{mode}", per_thread, args.threads, key
    )
    out = RESULTS_DIR / f"profile-{stamp}-{target.name}-{mode}.txt"
    record = ["record", "--pid", str(srv.http_pid), "--function", "--nonblocking"]
    output = ["--duration", str(int(args.duration)), "--format", "raw", "-o", str(out)]
    spy = subprocess.Popen(
        [py_spy, *record, *output],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # let py-spy attach before the load starts
    result = run_cell_load(
        wrk, srv.url + target.path, args, connections, mode, prefix, body, work / "ack"
    )
    spy.wait(timeout=args.duration + 60)
    print(
        f"\n== {target.name}, {connections} connections, {mode} ids, under py-spy: "
        f"{result.rps:.0f} req/s, p99 {result.p99_ms:.1f} ms (under sampling)"
    )
    print(f"collapsed stacks: {out}\n")
    print(analyse(out))
