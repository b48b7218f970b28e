"""bench/rejected: good deliveries' ingest latency under a flood of bad requests, against the
same load without the flood, in the same run (issue 64 item 13).

One `webhook-inbox serve --no-worker` (one HTTP process) with two sources: `bench`, which
takes the good deliveries, and `guarded`, whose `token` the flood never sends (401, each one
kept in `inbox_rejected_deliveries`). Each round runs the good open-loop load alone, then
again beside a flood of `--flood` bad requests offered as fast as the open-loop generator
sends them (`--flood-seconds`), in alternating order. The table's rows are counted after each
flood: the bound (`INBOX_REJECTED_PER_SOURCE`) must hold.

What it cannot separate on a 2-core machine: the flood's own HTTP work (parsing and answering
50,000 requests) takes CPU the good deliveries' process shares, recorded or not. The ratio is
therefore an upper bound on what recording the refusals costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.pg import BenchPostgres, connected
from bench.servers import Server
from bench.systems import RESULTS_DIR, console_script

ROOT = Path(__file__).resolve().parents[1]

SOURCES_TOML = """
[sources.bench]
kind = "generic"
id_header = "X-Message-Id"

[sources.guarded]
kind = "generic"
id_header = "X-Message-Id"
token = "{token}"
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/rejected", description=__doc__)
    parser.add_argument("--rate", type=float, default=300.0, help="good deliveries/s (300)")
    parser.add_argument("--seconds", type=float, default=20.0, help="good load per run (20)")
    parser.add_argument("--flood", type=int, default=50_000, help="bad requests a flood (50000)")
    parser.add_argument(
        "--flood-seconds", type=float, default=10.0, help="over how long they are offered (10)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both runs (3)")
    parser.add_argument("--keep", type=int, default=500, help="INBOX_REJECTED_PER_SOURCE (500)")
    return parser.parse_args(argv)


def openloop(url: str, rate: float, seconds: float, prefix: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "bench.openloop", "--url", url, "--rate", str(rate)]
    command += ["--duration", str(seconds), "--prefix", prefix, "--max-connections", "256"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def result_of(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"bench.openloop exited {process.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result.pop("per_second", None)
    return result


async def rejected_rows(url: str) -> dict[str, int]:
    async with connected(url) as conn:
        rows = await conn.fetch(
            "SELECT source, count(*) AS n FROM inbox_rejected_deliveries GROUP BY source"
        )
    return {r["source"]: r["n"] for r in rows}


def unrecorded(server_url: str) -> float:
    text = httpx.get(f"{server_url}/metrics", timeout=10).text
    prefix = 'webhook_inbox_rejections_unrecorded_total{source="guarded"}'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def run_once(srv: Server, args: argparse.Namespace, name: str, flood: bool) -> dict[str, Any]:
    good = openloop(f"{srv.url}/webhooks/bench", args.rate, args.seconds, name)
    bad = None
    if flood:
        # Started a second into the good load, so that the flood lies inside it.
        time.sleep(1.0)
        rate = args.flood / args.flood_seconds
        bad = openloop(f"{srv.url}/webhooks/guarded", rate, args.flood_seconds, f"{name}-bad")
    measured = {"good": result_of(good)}
    if bad is not None:
        measured["bad"] = result_of(bad)
    return measured


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="inbox-bench-rejected-"))
    config = work / "sources.toml"
    config.write_text(SOURCES_TOML.format(token=secrets.token_hex(16)))
    runs: list[dict[str, Any]] = []
    with BenchPostgres() as pg:
        env = {
            "DATABASE_URL": pg.url,
            "INBOX_CONFIG": str(config),
            "INBOX_DATA_DIR": str(work / "inbox-data"),
            "INBOX_ADMIN_TOKENS": secrets.token_hex(16),
            "INBOX_LOG_LEVEL": "WARNING",
            "INBOX_REJECTED_PER_SOURCE": str(args.keep),
        }
        command = [*console_script("webhook-inbox"), "serve", "--no-worker"]
        with Server("service", command, env, work / "serve.log") as srv:
            result_of(openloop(f"{srv.url}/webhooks/bench", args.rate, 3, "warm"))
            for round_no in range(args.rounds):
                order = (False, True) if round_no % 2 == 0 else (True, False)
                for flood in order:
                    name = f"r{round_no}-{'flood' if flood else 'alone'}"
                    measured = run_once(srv, args, name, flood)
                    # The writer flushes every half second: give it a few, then count.
                    time.sleep(2.0)
                    measured["rows"] = asyncio.run(rejected_rows(pg.url))
                    measured["unrecorded"] = unrecorded(srv.url)
                    runs.append({"round": round_no, "flood": flood, **measured})
                    print(summary_line(runs[-1]), flush=True)
    report = summarise(runs, args)
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"rejected-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "runs": runs, "summary": report}, indent=2))
    print(json.dumps(report, indent=2))
    print(f"written to {path}")


def summary_line(run: dict[str, Any]) -> str:
    good = run["good"]
    line = (
        f"round {run['round']} {'flood' if run['flood'] else 'alone'}: good p50/p99 "
        f"{good['latency_ms']['p50']}/{good['latency_ms']['p99']} ms, "
        f"{good['acked']}/{good['requests']} acked; rows {run['rows']}"
    )
    if "bad" in run:
        flood = run["bad"]
        line += (
            f"; flood {flood['requests']} at {flood['achieved_rate']}/s, "
            f"statuses {flood['statuses']}, unrecorded so far {run['unrecorded']:.0f}"
        )
    return line


def summarise(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    def p99s(flood: bool) -> list[float]:
        return [r["good"]["latency_ms"]["p99"] for r in runs if r["flood"] == flood]

    alone, flooded = statistics.median(p99s(False)), statistics.median(p99s(True))
    return {
        "good_p99_ms_alone": alone,
        "good_p99_ms_flooded": flooded,
        "ratio": round(flooded / alone, 3),
        "within_10_percent": flooded <= alone * 1.10,
        "bound_held": all(
            n <= args.keep for r in runs for source, n in r["rows"].items() if source
        ),
        "good_all_acked": all(r["good"]["acked"] == r["good"]["requests"] for r in runs),
    }


if __name__ == "__main__":
    main()
