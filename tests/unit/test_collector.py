"""The collector settings of the HTTP and processing processes (`settle_collector`), in a fresh
interpreter so that the test process's own collector is left as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from service.core.collector import YOUNG_COLLECTION_THRESHOLD

PROBE = """
import gc, json, weakref
import service.worker.runtime  # start-up: what a processing process has imported by then
from service.core.collector import settle_collector

class Node:
    pass

before = gc.get_threshold()
settle_collector()
frozen = gc.get_freeze_count()

# A cycle made after start-up is still found and freed by a full collection.
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen,
                  "cycle_freed": gone() is None, "enabled": gc.isenabled()}))
"""


def run_probe(code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """What `code`, run in a fresh interpreter, printed last as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return facts


def test_settle_collector_freezes_start_up_and_collects_the_young_less_often() -> None:
    facts = run_probe(PROBE)
    assert facts["before"][0] < YOUNG_COLLECTION_THRESHOLD
    assert facts["after"] == [YOUNG_COLLECTION_THRESHOLD, *facts["before"][1:]]
    assert facts["frozen"] > 10_000  # the modules and what importing them built
    assert facts["enabled"]
    assert facts["cycle_freed"]


# The HTTP child as `serve` runs it, up to the moment uvicorn would start serving: what the
# collector is then set to is what every request is served under.
HTTP_CHILD_PROBE = """
import gc, json, os, socket
import uvicorn
from service import serve

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
os.environ[serve.LISTEN_FD_ENV] = str(sock.fileno())
seen = {}

def run(self, sockets=None):
    seen.update(threshold=gc.get_threshold(), frozen=gc.get_freeze_count(),
                app=type(self.config.app).__name__)

uvicorn.Server.run = run
serve.run_http_child()
print(json.dumps(seen))
"""


def test_the_http_child_settles_its_collector_before_it_serves(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": "postgresql://inbox@127.0.0.1:1/none",  # never reached: nothing serves
        "INBOX_DATA_DIR": str(tmp_path),
        "INBOX_LOG_LEVEL": "WARNING",
    }
    seen = run_probe(HTTP_CHILD_PROBE, env)
    assert seen["app"] == "InboxApp"  # the app serve builds, about to be served
    assert seen["threshold"][0] == YOUNG_COLLECTION_THRESHOLD
    assert seen["frozen"] > 10_000
