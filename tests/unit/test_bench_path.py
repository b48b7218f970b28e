"""bench.path drives the HTTP process's real delivery path in process: it must keep working as
that path changes, or its figures silently stop meaning anything."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.path import by_function, by_library, per_delivery

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


# A callgrind profile as callgrind writes one: objects named once, then by number; a callee's
# object named first in a `cob=` line; a call's inclusive cost on the line after `calls=`.
PROFILE = """\
# callgrind format
version: 1
positions: line
events: Ir
summary: 117

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) ceval.c
fn=(1) eval
10 50
+2 7
cob=(2) /usr/lib/x86_64-linux-gnu/libcrypto.so.3
cfi=(2) sha.c
cfn=(2) sha256
calls=3 +5
* 40
-1 10

ob=(2)
fl=(2)
fn=(2)
5 40

ob=(3) /venv/jiter.cpython-311-x86_64-linux-gnu.so
fl=(3) parse.rs
fn=(3) parse
* 10
"""


def test_by_library_counts_each_objects_own_instructions_once(tmp_path: Path) -> None:
    profile = tmp_path / "callgrind.out"
    profile.write_text(PROFILE)
    assert by_library(profile) == {
        "/usr/lib/libpython3.11.so.1.0": 67,  # its own lines; the call's 40 are sha256's
        "/usr/lib/x86_64-linux-gnu/libcrypto.so.3": 40,
        "/venv/jiter.cpython-311-x86_64-linux-gnu.so": 10,
    }
    assert sum(by_library(profile).values()) == 117  # the profile's summary


def test_by_function_counts_each_functions_own_instructions_once(tmp_path: Path) -> None:
    profile = tmp_path / "callgrind.out"
    profile.write_text(PROFILE)
    # sha256 named once in the call (`cfn=(2) sha256`), then by its number alone (`fn=(2)`).
    assert by_function(profile) == {"eval": 67, "sha256": 40, "parse": 10}


@pytest.mark.parametrize("option", ["--by-library", "--by-function"])
def test_a_split_needs_instructions(option: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.path", option],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"{option} counts instructions" in done.stderr


def test_per_delivery_is_the_difference_a_delivery_with_one_name_per_file() -> None:
    before = {"/a/parser.so": 1_000, "/b/parser.so": 500, "/lib/libc.so.6": 2_000}
    after = {"/a/parser.so": 3_000, "/b/parser.so": 1_500, "/lib/libc.so.6": 2_000, "/x/new.so": 40}
    assert per_delivery(before, after, 10) == {
        "parser.so": 300.0,  # (2,000 + 1,000) / 10: the two parsers add up
        "libc.so.6": 0.0,
        "new.so": 4.0,
    }
    functions = {
        "/a/parser.so": 200.0,
        "/b/parser.so": 100.0,
        "/lib/libc.so.6": 0.0,
        "/x/new.so": 4.0,
    }
    assert per_delivery(before, after, 10, by_file=False) == functions  # names kept whole
