"""The garbage collector's settings for a long-running process once its start-up is done."""

from __future__ import annotations

import gc

# Objects allocated, less those freed, before a young collection (CPython's default is 700).
# A processing batch leaves ORM rows and their states, dataclasses and driver records alive
# until it ends; an HTTP process keeps every request in flight alive (its head, coroutines,
# futures, its parsed body). At 700, each young collection walks whatever of them is alive:
# bench/process's `add` drain ran 630 young collections per 20,000 messages, and ingest at 128
# connections spent 6% of the HTTP process's CPU in collections.
YOUNG_COLLECTION_THRESHOLD = 5000


def settle_collector() -> None:
    """Call once a process has built what it keeps (handlers loaded, app created), before it
    takes work.

    What start-up built (modules, the app and its routes, the mapper registry, settings) lives
    as long as the process: frozen, the collector stops walking it at each full collection. And
    the young generation is collected less often, since most of a batch's or a request's
    objects die with it. Measured: in bench/process's `add` drain of 20,000 messages, the
    worker's collections took 0.72-0.82 s of CPU before this and 0.14-0.19 s after, start-up
    included; in bench/ingest at 128 connections, the HTTP process's CPU a delivery fell from
    150-181 us to 136-140 (`generic`) and from 172-219 to 165-170 (`standard-webhooks`), three
    alternating runs each (docs/benchmarks-log.md).
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)
