"""bench/ingest's verdicts on issue 13's targets come from `bench.report.summarise`: a ratio or a
rule computed wrongly there would report a target met that was not (or the reverse), whatever
the cells measured."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench.report import MIB, render, summarise
from bench.systems import Cell, Process

ARGS = argparse.Namespace(connections=[32, 128], ids=["unique"])


def run(rps: float, p99_ms: float = 10.0, **changes: Any) -> dict[str, Any]:
    stored = changes.pop("stored", {"checked": True, "ok": True, "missing": 0})
    return {
        "rps": rps,
        "p50_ms": 3.0,
        "p99_ms": p99_ms,
        "non_2xx": 0,
        "socket_errors": 0,
        "wrapped": 0,
        "cpu_us_per_request": 90.0,
        "stored": stored,
        **changes,
    }


def unstored(rps: float, **changes: Any) -> dict[str, Any]:
    """A baseline's run: it stores nothing, so nothing is checked."""
    return run(rps, stored={"checked": False}, **changes)


def cells(**runs: list[dict[str, Any]]) -> dict[tuple[str, int, str], Cell]:
    """`generic_32=[...]` is the runs of target `generic` at 32 connections."""
    found: dict[tuple[str, int, str], Cell] = {}
    for key, target_runs in runs.items():
        name, _, connections = key.rpartition("_")
        target = name.replace("_", "-")
        found[(target, int(connections), "unique")] = Cell(
            target, int(connections), "unique", target_runs
        )
    return found


def service(peak_mb: int = 100) -> list[Process]:
    return [Process("service", [], {}, [], peak_rss=[peak_mb * MIB])]


def summary_with(**changed: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of a run that met every target (`passing_cells`) but for the `changed`
    cells, its service within its memory limit."""
    return summarise(passing_cells(**changed), service(), ARGS)


def verdicts(summary: dict[str, Any]) -> dict[str, bool | None]:
    return {t["target"]: t["pass"] for t in summary["targets"]}


def summary_row(summary: dict[str, Any], target: str, connections: int) -> dict[str, Any]:
    """`target`'s summary at `connections` (its `unique` cell, the only one these tests run)."""
    (row,) = [
        r for r in summary["rows"] if (r["target"], r["connections"]) == (target, connections)
    ]
    return row


def table_columns(summary: dict[str, Any], target: str, connections: int) -> list[str]:
    """The columns of `target`'s line at `connections` in the rendered table."""
    lines = render(summary).splitlines()
    (line,) = [x for x in lines if x.split()[:2] == [target, str(connections)]]
    return line.split()


def passing_cells(**changed: list[dict[str, Any]]) -> dict[tuple[str, int, str], Cell]:
    """Every target met: `serve` 1.6x A at 32 connections, 1.4x at 128, and so on."""
    runs = {
        "baseline_A_32": [unstored(6000)] * 3,
        "baseline_A_128": [unstored(6000)] * 3,
        "baseline_B_32": [run(500)] * 3,
        "baseline_B_128": [run(500)] * 3,
        "generic_32": [run(9600)] * 3,
        "generic_128": [run(9600)] * 3,
        "generic_serve_32": [run(9600)] * 3,
        "generic_serve_128": [run(8400)] * 3,
        "standard_webhooks_32": [run(9000)] * 3,
        "standard_webhooks_128": [run(9000)] * 3,
    }
    runs.update(changed)
    return cells(**runs)


def test_every_target_met_passes() -> None:
    summary = summary_with()
    assert all(v is True for v in verdicts(summary).values()), summary["targets"]
    assert summary["all_pass"]


def test_a_ratio_is_of_the_medians_over_rounds() -> None:
    # `serve`'s rounds 8000, 9000, 9900 (median 9000) against A's 6000, 6100, 5000 (6000):
    # 1.5x, though two of the three rounds' own ratios (1.33x, 1.48x) are below it.
    summary = summary_with(
        generic_serve_32=[run(8000), run(9000), run(9900)],
        baseline_A_32=[unstored(6000), unstored(6100), unstored(5000)],
    )
    (at_32,) = [r for r in summary["ratios"] if r["connections"] == 32]
    assert at_32["serve/A"] == 1.5
    assert verdicts(summary)["default serve >= 1.5x baseline A at 32 conns"] is True


def test_serve_below_1_5x_at_32_connections_fails_only_that_target() -> None:
    summary = summary_with(generic_serve_32=[run(8940)] * 3)
    failed = [t for t, ok in verdicts(summary).items() if ok is not True]
    assert failed == ["default serve >= 1.5x baseline A at 32 conns"]
    assert not summary["all_pass"]
    assert "FAIL  default serve >= 1.5x baseline A at 32 conns min 1.49x over 1 cells" in (
        render(summary)
    )


def test_the_p99_target_takes_each_cells_median_over_rounds() -> None:
    one_stall = [run(9600, 400.0), run(9600, 12.0), run(9600, 11.0)]
    summary = summary_with(generic_32=one_stall)
    assert verdicts(summary)["service p99 <= 25 ms at 32 connections"] is True

    two_stalls = [run(9600, 400.0), run(9600, 30.0), run(9600, 11.0)]
    summary = summary_with(generic_32=two_stalls)
    assert verdicts(summary)["service p99 <= 25 ms at 32 connections"] is False
    # 128 connections have no p99 target.
    summary = summary_with(generic_128=two_stalls)
    assert verdicts(summary)["service p99 <= 25 ms at 32 connections"] is True


def test_one_failed_request_or_missing_id_in_any_round_fails() -> None:
    summary = summary_with(generic_128=[run(9600), run(9600, non_2xx=1), run(9600)])
    assert verdicts(summary)["service: zero non-2xx and socket errors"] is False

    lost = {"checked": True, "ok": False, "missing": 2}
    summary = summary_with(standard_webhooks_32=[run(9000), run(9000, stored=lost), run(9000)])
    assert verdicts(summary)["service: every acknowledged id stored"] is False
    assert "2 missing" in render(summary)


def test_a_target_with_nothing_measured_is_not_applicable_and_fails_nothing() -> None:
    only_generic = cells(generic_32=[run(9600)], generic_128=[run(9600)])
    summary = summarise(only_generic, service(), ARGS)
    found = verdicts(summary)
    assert found["default serve >= 1.5x baseline A at 32 conns"] is None
    assert found["standard-webhooks >= 0.9x generic rps"] is None
    assert found["service p99 <= 25 ms at 32 connections"] is True
    assert summary["all_pass"]
    assert "n/a   default serve >= 1.5x baseline A at 32 conns not measured" in render(summary)


def test_the_rss_limit_is_the_service_processes_peak() -> None:
    summary = summarise(passing_cells(), service(peak_mb=200), ARGS)
    assert verdicts(summary)["service peak RSS < 200 MB"] is False


def test_a_stored_cell_that_ran_out_of_requests_is_invalid() -> None:
    summary = summary_with(
        generic_32=[run(9600), run(9600, wrapped=5), run(9600)],
        baseline_A_32=[unstored(6000, wrapped=7)] * 3,
    )
    # A baseline stores nothing, so repeated requests do not void its cells.
    assert [r["target"] for r in summary["invalid_cells"]] == ["generic"]
    assert "INVALID" in render(summary)


def test_the_clients_cpu_is_the_median_over_rounds_and_shown_where_measured() -> None:
    summary = summary_with(
        generic_32=[
            run(9600, wrk_cpu_us_per_request=14.0),
            run(9600, wrk_cpu_us_per_request=30.0),
            run(9600, wrk_cpu_us_per_request=16.0),
        ]
    )
    assert summary_row(summary, "generic", 32)["wrk_cpu_us_per_request"] == 16.0
    assert summary_row(summary, "generic", 128)["wrk_cpu_us_per_request"] is None  # not measured
    assert render(summary).split("\n", 1)[0].split()[-4:] == ["us/req", "wrk", "us/req", "busy"]
    assert table_columns(summary, "generic", 32)[-2] == "16"


def test_cores_busy_is_the_median_of_each_rounds_rate_times_its_cpu_a_request() -> None:
    # Rounds busy 0.9, 0.72 and 0.8 cores; the median rate times the median CPU would be 0.9.
    summary = summary_with(
        generic_32=[
            run(10000, cpu_us_per_request=90.0),
            run(12000, cpu_us_per_request=60.0),
            run(8000, cpu_us_per_request=100.0),
        ],
        baseline_B_32=[{k: v for k, v in run(500).items() if k != "cpu_us_per_request"}] * 3,
    )
    assert summary_row(summary, "generic", 32)["cores_busy"] == pytest.approx(0.8)
    assert summary_row(summary, "baseline-B", 32)["cores_busy"] is None  # CPU not measured
    assert table_columns(summary, "generic", 32)[-1] == "0.80"
    assert table_columns(summary, "baseline-B", 32)[-1] == "-"


def test_the_ratios_by_round_pair_each_rounds_cells_and_are_shown_not_judged() -> None:
    # Round 1's pair ran at 1.25x, round 0's at 1.5x; the ratio of the medians is 1.357x.
    # Baseline A's runs are listed out of round order: the pairing is by round number.
    summary = summary_with(
        baseline_A_32=[unstored(8000, round=1), unstored(6000, round=0)],
        generic_serve_32=[run(9000, round=0), run(10000, round=1)],
    )
    at_32 = next(r for r in summary["ratios"] if r["connections"] == 32)
    assert at_32["by_round"]["serve/A"] == [1.5, 1.25]
    assert at_32["serve/A"] == 9500 / 7000
    assert at_32["by_round"]["generic/A"] == []  # generic's runs carry no round: nothing paired
    assert verdicts(summary)["default serve >= 1.5x baseline A at 32 conns"] is False
    lines = render(summary).splitlines()
    by_round = lines.index(next(x for x in lines if x.startswith("ratios by round")))
    assert lines[by_round + 2].split()[:4] == ["32", "unique", "1.50", "1.25"]


def test_no_ratios_by_round_are_shown_when_no_run_names_its_round() -> None:
    assert "ratios by round" not in render(summary_with())
