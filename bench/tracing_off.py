"""What tracing costs a delivery when it is off: the ingest path's three hooks, timed in-process.

.venv/bin/python -m bench.tracing_off
"""

from __future__ import annotations

import time
import timeit

from service.core import tracing
from service.sources.base import Message

HEADERS = [(b"content-type", b"application/json")]
MESSAGES = [Message("evt_1", "invoice.paid")]
RUNS = 200_000


def one_delivery() -> None:
    """The hooks `service/api/ingest.py` calls for one delivery."""
    with tracing.delivery_span("demo", HEADERS):
        tracing.traced_messages("generic", MESSAGES)
        tracing.delivery_outcome("evt_1", "accepted")


def main() -> None:
    assert not tracing.enabled(), "run it with tracing off (no OTEL_* variables)"
    for _ in range(3):
        # CPU time, not wall time: on a shared machine the wall clock counts other processes.
        seconds = timeit.timeit(one_delivery, number=RUNS, timer=time.process_time)
        print(f"{seconds / RUNS * 1e9:.0f} ns of CPU per delivery (tracing off, three hooks)")


if __name__ == "__main__":
    main()
