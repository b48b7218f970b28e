"""The processing process's collector settings (`settle_collector`), in a fresh interpreter so
that the test process's own collector is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys

from service.worker.runtime import YOUNG_COLLECTION_THRESHOLD

PROBE = """
import gc, json, weakref
from service.worker.runtime import settle_collector

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


def test_settle_collector_freezes_start_up_and_collects_the_young_less_often() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    facts = json.loads(done.stdout)
    assert facts["before"][0] < YOUNG_COLLECTION_THRESHOLD
    assert facts["after"] == [YOUNG_COLLECTION_THRESHOLD, *facts["before"][1:]]
    assert facts["frozen"] > 10_000  # the modules and what importing them built
    assert facts["enabled"]
    assert facts["cycle_freed"]
