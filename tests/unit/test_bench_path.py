"""bench.path drives the HTTP process's real delivery path in process: it must keep working as
that path changes, or its figures silently stop meaning anything."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_path_reports_each_sources_cpu_a_delivery() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.path", "--rounds", "5", "--runs", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # A run fails, saying why, if any answer is not a 200 or any delivery goes unanswered.
    assert done.returncode == 0, done.stdout + done.stderr
    figures = dict(re.findall(r"^(\S+)\s+([\d.]+) us of CPU a delivery$", done.stdout, re.M))
    assert set(figures) == {"generic", "standard-webhooks", "baseline-A"}
    assert all(float(us) > 0 for us in figures.values())
