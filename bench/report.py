"""bench/ingest's table, ratios and targets, from the runs of each cell."""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.systems import Cell, Process

MIB = 1024 * 1024
SERVICE_TARGETS = ("generic", "generic-serve", "standard-webhooks")


def progress_line(target: str, connections: int, mode: str, run: dict[str, Any]) -> str:
    stored = run["stored"]
    check = "-" if not stored["checked"] else ("ok" if stored["ok"] else "MISSING")
    return (
        f"  {target:<18} c={connections:<4} {mode:<7} {run['rps']:>8.0f} rps  "
        f"p50 {run['p50_ms']:6.1f} ms  p99 {run['p99_ms']:7.1f} ms  "
        f"non-2xx {run['non_2xx']}  errors {run['socket_errors']}  stored {check}  "
        f"cpu {run.get('cpu_us_per_request', 0):.0f} us/req"
        + (
            f" (postgres {run['pg_cpu_us_per_request']:.0f})"
            if "pg_cpu_us_per_request" in run
            else ""
        )
        + (
            f"  wrk {run['wrk_cpu_us_per_request']:.0f} us/req"
            if "wrk_cpu_us_per_request" in run
            else ""
        )
        + (
            f"  RAN OUT OF REQUESTS ({run['wrapped']})"
            if run["wrapped"] and stored["checked"]
            else ""
        )
    )


def _cell_summary(cell: Cell) -> dict[str, Any]:
    runs = cell.runs
    checked = [r["stored"] for r in runs if r["stored"]["checked"]]
    return {
        "target": cell.target,
        "connections": cell.connections,
        "mode": cell.mode,
        "rounds": len(runs),
        # Medians over rounds; failures are summed: one is one too many.
        "rps": statistics.median(r["rps"] for r in runs),
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "p99_worst_ms": max(r["p99_ms"] for r in runs),
        "cpu_us_per_request": statistics.median(r.get("cpu_us_per_request", 0) for r in runs),
        "pg_cpu_us_per_request": (
            statistics.median(r["pg_cpu_us_per_request"] for r in runs)
            if all("pg_cpu_us_per_request" in r for r in runs)
            else None
        ),
        "wrk_cpu_us_per_request": (
            statistics.median(r["wrk_cpu_us_per_request"] for r in runs)
            if all("wrk_cpu_us_per_request" in r for r in runs)
            else None
        ),
        # How many cores the server's processes kept busy (its CPU seconds over the cell's),
        # the median of each round's own: at 32 connections the service's HTTP process idles
        # while every request waits for a commit, which its CPU a request does not show.
        "cores_busy": (
            statistics.median(r["rps"] * r["cpu_us_per_request"] / 1e6 for r in runs)
            if all("cpu_us_per_request" in r for r in runs)
            else None
        ),
        "non_2xx": sum(r["non_2xx"] for r in runs),
        "socket_errors": sum(r["socket_errors"] for r in runs),
        "wrapped": sum(r["wrapped"] for r in runs),
        "stored": None if not checked else all(c["ok"] for c in checked),
        "missing": sum(c["missing"] for c in checked),
    }


# The ratios the targets read, also taken within each round: bench/ingest runs a cell for
# every system seconds apart, so a round's pair saw nearly the same machine, and their spread
# over the rounds shows how far the run's own noise reaches. Shown, not judged: the targets
# read the ratio of the medians.
ROUND_RATIOS = {
    "serve/A": ("generic-serve", "baseline-A"),
    "generic/A": ("generic", "baseline-A"),
    "std-webhooks/generic": ("standard-webhooks", "generic"),
    "serve/no-worker": ("generic-serve", "generic"),
}


def summarise(
    cells: dict[tuple[str, int, str], Cell], processes: list[Process], args: argparse.Namespace
) -> dict[str, Any]:
    rows = [_cell_summary(c) for c in cells.values() if c.runs]
    by_key = {(r["target"], r["connections"], r["mode"]): r for r in rows}

    def ratio(num: str, den: str, conns: int, mode: str) -> float | None:
        a, b = by_key.get((num, conns, mode)), by_key.get((den, conns, mode))
        return a["rps"] / b["rps"] if a and b and b["rps"] else None

    def by_round(num: str, den: str, conns: int, mode: str) -> list[float]:
        """The ratio in each round both cells ran, in round order (paired by round number)."""
        a, b = cells.get((num, conns, mode)), cells.get((den, conns, mode))
        if a is None or b is None:
            return []
        below = {r["round"]: r["rps"] for r in b.runs if "round" in r and r["rps"]}
        above = {r["round"]: r["rps"] for r in a.runs if "round" in r}
        return [above[n] / below[n] for n in sorted(above.keys() & below.keys())]

    ratios = [
        {
            "connections": conns,
            "mode": mode,
            "generic/A": ratio("generic", "baseline-A", conns, mode),
            "generic/B": ratio("generic", "baseline-B", conns, mode),
            "std-webhooks/generic": ratio("standard-webhooks", "generic", conns, mode),
            # What the processing process beside HTTP costs ingest (default `serve`).
            "serve/no-worker": ratio("generic-serve", "generic", conns, mode),
            "serve/A": ratio("generic-serve", "baseline-A", conns, mode),
            # How much of the machine's HTTP floor each keeps (no target: a bound to read).
            "generic/F": ratio("generic", "baseline-F", conns, mode),
            "A/F": ratio("baseline-A", "baseline-F", conns, mode),
            "by_round": {
                name: by_round(num, den, conns, mode) for name, (num, den) in ROUND_RATIOS.items()
            },
        }
        for conns in args.connections
        for mode in args.ids
    ]
    service_rows = [r for r in rows if r["target"] in SERVICE_TARGETS]
    rss = {p.name: max(p.peak_rss, default=0) for p in processes}

    def all_ratios(name: str, floor: float, conns: int | None = None) -> tuple[bool | None, str]:
        values = [
            r[name]
            for r in ratios
            if r[name] is not None and (conns is None or r["connections"] == conns)
        ]
        if not values:
            return None, "not measured"
        return min(values) >= floor, f"min {min(values):.2f}x over {len(values)} cells"

    p99_32 = [r for r in service_rows if r["connections"] == 32]
    errors = sum(r["non_2xx"] + r["socket_errors"] for r in service_rows)
    stored = [r["stored"] for r in rows if r["stored"] is not None]
    service_stored = [r["stored"] for r in service_rows if r["stored"] is not None]
    targets = [
        # Issue 13: the default `serve`, with INFO JSON logs, against bare FastAPI.
        ("default serve >= 1.5x baseline A at 32 conns", *all_ratios("serve/A", 1.5, 32)),
        ("default serve >= 1.2x baseline A at 128 conns", *all_ratios("serve/A", 1.2, 128)),
        ("generic >= 1.5x baseline A rps", *all_ratios("generic/A", 1.5)),
        ("generic >= 10x baseline B rps", *all_ratios("generic/B", 10)),
        ("standard-webhooks >= 0.9x generic rps", *all_ratios("std-webhooks/generic", 0.9)),
        (
            "default serve >= 0.85x serve --no-worker rps",
            *all_ratios("serve/no-worker", 0.85),
        ),
        (
            "service p99 <= 25 ms at 32 connections",
            all(r["p99_ms"] <= 25 for r in p99_32) if p99_32 else None,
            "worst median p99 " + (f"{max(r['p99_ms'] for r in p99_32):.1f} ms" if p99_32 else "-"),
        ),
        (
            "service: zero non-2xx and socket errors",
            errors == 0 if service_rows else None,
            f"{errors} in all runs",
        ),
        (
            "service: every acknowledged id stored",
            all(service_stored) if service_stored else None,
            f"{sum(r['missing'] for r in service_rows)} missing",
        ),
        (
            "service peak RSS < 200 MB",
            rss["service"] < 200 * MIB if rss.get("service") else None,
            f"{rss.get('service', 0) / MIB:.0f} MB",
        ),
    ]
    return {
        "rows": rows,
        "ratios": ratios,
        "peak_rss_mb": {k: round(v / MIB, 1) for k, v in rss.items()},
        "targets": [{"target": t, "pass": ok, "detail": d} for t, ok, d in targets],
        "all_pass": all(ok is not False for _, ok, _ in targets),
        "all_stored": all(stored),
        # A target that stores nothing (baselines A and F) sees a repeated request no differently,
        # so running out of fresh ones (the floor outruns any --max-rps worth generating) does
        # not void its cells.
        "invalid_cells": [r for r in rows if r["wrapped"] and r["stored"] is not None],
    }


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _render_by_round(ratios: list[dict[str, Any]]) -> list[str]:
    """The target ratios of each round, in round order: blank where no round had both cells."""
    shown = {
        name: [" ".join(f"{v:.2f}" for v in r.get("by_round", {}).get(name, [])) for r in ratios]
        for name in ROUND_RATIOS
    }
    if not any(any(texts) for texts in shown.values()):
        return []
    widths = {name: max(len(name), *(len(t) for t in texts)) for name, texts in shown.items()}
    header = "  ".join(f"{name:<{widths[name]}}" for name in ROUND_RATIOS)
    rule = "  ".join("-" * widths[name] for name in ROUND_RATIOS)
    lines = [
        "",
        f"ratios by round    conns  ids     {header}",
        f"-----------------  -----  ------  {rule}",
    ]
    for i, r in enumerate(ratios):
        values = "  ".join(f"{shown[name][i]:<{widths[name]}}" for name in ROUND_RATIOS)
        lines.append(f"{'':<17}  {r['connections']:>5}  {r['mode']:<6}  {values}".rstrip())
    return lines


def render(summary: dict[str, Any]) -> str:
    lines = [
        "system             conns  ids     req/s    p50 ms   p99 ms  non-2xx  errors  stored"
        "  CPU us/req  PG us/req  wrk us/req  busy",
        "-----------------  -----  ------  -------  -------  -------  -------  ------  ------"
        "  ----------  ---------  ----------  ----",
    ]
    for r in summary["rows"]:
        stored = "-" if r["stored"] is None else ("ok" if r["stored"] else "MISSING")
        pg = r.get("pg_cpu_us_per_request")
        client = r.get("wrk_cpu_us_per_request")
        busy = r.get("cores_busy")
        lines.append(
            f"{r['target']:<17}  {r['connections']:>5}  {r['mode']:<6}  {r['rps']:>7.0f}  "
            f"{r['p50_ms']:>7.1f}  {r['p99_ms']:>7.1f}  {r['non_2xx']:>7}  "
            f"{r['socket_errors']:>6}  {stored:>6}  {r['cpu_us_per_request']:>10.0f}"
            f"  {'-' if pg is None else f'{pg:.0f}':>9}"
            f"  {'-' if client is None else f'{client:.0f}':>10}"
            f"  {'-' if busy is None else f'{busy:.2f}':>4}"
        )
    lines += [
        "",
        "ratios (req/s)     conns  ids     generic/A  generic/B  std-webhooks/generic  "
        "serve/no-worker  serve/A  generic/F    A/F",
        "-----------------  -----  ------  ---------  ---------  --------------------  "
        "---------------  -------  ---------  -----",
    ]
    for r in summary["ratios"]:
        lines.append(
            f"{'':<17}  {r['connections']:>5}  {r['mode']:<6}  {_fmt(r['generic/A']):>9}  "
            f"{_fmt(r['generic/B']):>9}  {_fmt(r['std-webhooks/generic']):>20}  "
            f"{_fmt(r['serve/no-worker']):>15}  {_fmt(r['serve/A']):>7}  "
            f"{_fmt(r['generic/F']):>9}  {_fmt(r['A/F']):>5}"
        )
    lines += _render_by_round(summary["ratios"])
    rss = ", ".join(f"{k} {v:.0f} MB" for k, v in summary["peak_rss_mb"].items())
    lines += ["", f"peak RSS: {rss}", "", "targets:"]
    for t in summary["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
        lines.append(f"  {verdict}  {t['target']:<42} {t['detail']}")
    if summary["invalid_cells"]:
        lines.append("\nINVALID: some cells ran out of pre-generated requests; raise --max-rps")
    return "\n".join(lines)
