"""The measure half of bench/search: each search form through the service's own code, the
console's counts, a replay by search of 10,000 matches, and the plan of each search.

Every value a search looks for is drawn from what the fill wrote (bench/search_rows.py: row g
is stripe when g % 3 = 0, its customer `cus_{g % 10000}`, its object `ch_g`, `in_g`, `sub_g`
or `pi_g` by `(g / 3) % 8`), varied from call to call with a fixed seed, so that a cached row
does not flatter a form and two runs ask the same things.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.pg import connected
from bench.search_rows import CUSTOMERS, PACE_US
from service.api.admin.operations import collect_stats
from service.core.schema import Status
from service.store.admin import MessageFilter, bulk_retry, list_messages, where_sql
from service.store.counts import EndedCounts, status_counts
from service.store.search import SearchTooBroad, build_search

PAGE = 50
SEED = 67
REPLAY_TARGET = 10_000
REPLAY_ACTOR = "bench"
# A condition ~10,000 messages meet at every size: one card expiry month (1 in 12 stripe
# messages, so 1 in 36) in a window back from the newest message, sized to hold 10,000.
REPLAY_CONDITION = "data.object.payment_method_details.card.exp_month=7"
PER_HOUR = 3600 * 1_000_000 / PACE_US  # messages received an hour
REPLAY_SAVED = "bench_replay_saved"
# Calls cut at the service's 5 s after which a form is not called again: it is too broad.
TOO_BROAD_ENOUGH = 2
# An EXPLAIN ANALYZE that runs longer is shown as planned only.
EXPLAIN_TIMEOUT_MS = 8000

Draw = Callable[[random.Random], dict[str, Any]]


def stripe_row(rng: random.Random, low: int, high: int, kinds: tuple[int, ...] = ()) -> int:
    """A stripe row's number in [low, high], of one of the object kinds `kinds` when given."""
    while True:
        g = rng.randint(low, high) // 3 * 3
        if g >= max(low, 3) and (not kinds or (g // 3) % 8 // 2 in kinds):
            return g


def customer(rng: random.Random) -> str:
    return f"cus_{rng.randrange(CUSTOMERS)}"


def search_forms(rows: int) -> dict[str, Draw]:
    """Each search form, as the filters a call writes, drawn afresh for every call."""
    digits = len(str(rows))
    # A full-length id matches itself alone; one three digits short of the longest matches
    # about a thousand ids, a third of them stripe's.
    one_low = 10 ** (digits - 1) if rows - 10 ** (digits - 1) > 10_000 else 10 ** (digits - 2)
    one_high = min(rows, 10**digits - 1) if one_low == 10 ** (digits - 1) else one_low * 10 - 1
    many = 10 ** (digits - 4)
    return {
        "id prefix, one": lambda r: {"id_prefix": f"evt_{stripe_row(r, one_low, one_high)}"},
        "id prefix, many": lambda r: {"id_prefix": f"evt_{r.randint(many, 2 * many - 1)}"},
        "contains customer": lambda r: {
            "contains": f'{{"data": {{"object": {{"customer": "{customer(r)}"}}}}}}'
        },
        "where customer=": lambda r: {"where": [f"data.object.customer={customer(r)}"]},
        "where customer in 3": lambda r: {
            "where": [f"data.object.customer in {customer(r)},{customer(r)},{customer(r)}"]
        },
        # `exists` alone is refused (no index serves it); beside a customer, it is a filter on
        # that customer's messages. No message has this path (the fill has no rare one).
        "where customer= and exists (none has it)": lambda r: {
            "where": [f"data.object.customer={customer(r)}", "data.object.refunds exists"]
        },
        "where customer= and amount!=": lambda r: {
            "where": [
                f"data.object.customer={customer(r)}",
                f"data.object.amount!={500 + r.randrange(100_000)}",
            ]
        },
        "header shop domain (1 in 150)": lambda r: {
            "header": [f"X-Shopify-Shop-Domain: shop-{r.randrange(50)}.myshopify.com"]
        },
        "q charge id (1 match)": lambda r: {"q": f"ch_{stripe_row(r, 1, rows, kinds=(0,))}"},
        "q customer id": lambda r: {"q": customer(r)},
    }


def quantiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    cut = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(cut[98], 1),
        "max_ms": round(ms[-1], 1),
    }


class Statements:
    """The last SELECT on inbox_messages each call sent, with its parameters (for EXPLAIN)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.last: tuple[str, tuple[Any, ...]] | None = None

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
            if statement.lstrip().startswith("SELECT") and "inbox_messages" in statement:
                self.last = (statement, tuple(parameters or ()))


async def explain(url: str, statement: str, parameters: tuple[Any, ...]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of `statement`, planned for its values (as the first five
    calls of a prepared statement are) and as the generic plan a later call may get."""
    plans: dict[str, Any] = {}
    async with connected(url) as conn:
        await conn.execute(f"SET statement_timeout = {EXPLAIN_TIMEOUT_MS}")
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            try:
                rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", *parameters)
            except asyncpg.exceptions.QueryCanceledError:
                # Too slow to run to its end: its plan, as the planner costed it.
                rows = await conn.fetch(f"EXPLAIN {statement}", *parameters)
                rows = [[f"(not analysed: ran past {EXPLAIN_TIMEOUT_MS} ms)"], *rows]
            plans[mode.split("_")[1]] = [r[0] for r in rows]
    return plans


def with_variant(variant: str, newest: datetime) -> dict[str, Any]:
    if variant == "status=dead":
        return {"statuses": (Status.DEAD,)}
    if variant == "last day":
        return {"received_after": newest - timedelta(days=1)}
    return {}


async def time_form(
    engine: AsyncEngine,
    draw: Draw,
    extra: dict[str, Any],
    calls: int,
    warmup: int,
    rng: random.Random,
) -> dict[str, Any]:
    """`calls` first pages of `draw`'s searches (after `warmup`), each value drawn afresh;
    a form refused as too broad TOO_BROAD_ENOUGH times is not called again."""
    seconds: list[float] = []
    too_broad = 0
    rows_found = []
    for n in range(warmup + calls):
        search = build_search(**draw(rng))
        filters = MessageFilter(search=search, **extra)
        started = time.perf_counter()
        try:
            page, _ = await list_messages(engine, filters, PAGE, None)
        except SearchTooBroad:
            too_broad += 1
            page = []
        took = time.perf_counter() - started
        if n >= warmup or too_broad:
            seconds.append(took)
            rows_found.append(len(page))
        if too_broad >= TOO_BROAD_ENOUGH:
            break
    return {
        **quantiles(seconds),
        "calls": len(seconds),
        "too_broad": too_broad,
        "page_rows_median": statistics.median(rows_found),
    }


async def count_of(engine: AsyncEngine, filters: MessageFilter) -> int:
    """How many messages `filters` matches, as a dry run of a replay counts them."""
    forced = replace(filters, statuses=filters.statuses or (Status.PROCESSED, Status.DEAD))
    return (await bulk_retry(engine, forced, REPLAY_ACTOR, force=True, dry_run=True)).matched


async def measure_searches(
    engine: AsyncEngine, url: str, rows: int, newest: datetime, calls: int, say: Any
) -> dict[str, Any]:
    statements = Statements(engine)
    results: dict[str, Any] = {}
    for name, draw in search_forms(rows).items():
        for variant in ("alone", "status=dead", "last day"):
            extra = with_variant(variant, newest)
            rng = random.Random(f"{SEED}/{name}/{variant}")
            figures = await time_form(engine, draw, extra, calls, 5, rng)
            listed = statements.last  # the listing's statement, before the count's
            sample = build_search(**draw(random.Random(f"{SEED}/{name}")))
            figures["matches_sample"] = None
            if not figures["too_broad"]:
                with contextlib.suppress(SearchTooBroad):
                    figures["matches_sample"] = await count_of(
                        engine, MessageFilter(search=sample, **extra)
                    )
            if listed is not None:
                figures["explain"] = await explain(url, *listed)
            results[f"{name} / {variant}"] = figures
            say(
                f"  {name:<30} {variant:<12} p50 {figures['p50_ms']:>8.1f} ms  "
                f"p99 {figures['p99_ms']:>8.1f} ms  matches {figures['matches_sample']}"
                + (f"  too broad {figures['too_broad']}" if figures["too_broad"] else "")
            )
    return results


async def measure_dry_runs(engine: AsyncEngine, calls: int) -> dict[str, Any]:
    """The count a dry run of a bulk retry makes for one customer's messages."""
    rng = random.Random(f"{SEED}/dry run")
    seconds, counted = [], []
    for n in range(5 + calls):
        search = build_search(where=[f"data.object.customer={customer(rng)}"])
        started = time.perf_counter()
        matched = await count_of(engine, MessageFilter(search=search))
        if n >= 5:
            seconds.append(time.perf_counter() - started)
            counted.append(matched)
    return {**quantiles(seconds), "calls": calls, "matched_median": statistics.median(counted)}


async def measure_counts(engine: AsyncEngine, reads: int) -> dict[str, Any]:
    """The console's overview: the statistics document (`GET /admin/stats`), its counts by
    status read through a long-lived `EndedCounts` as the service holds one."""
    processed = EndedCounts(engine)
    try:
        started = time.perf_counter()
        await collect_stats(engine, processed)
        first = time.perf_counter() - started
        stats, counts = [], []
        for _ in range(reads):
            started = time.perf_counter()
            await collect_stats(engine, processed)
            stats.append(time.perf_counter() - started)
            started = time.perf_counter()
            await status_counts(engine, processed)
            counts.append(time.perf_counter() - started)
            await asyncio.sleep(0.1)
    finally:
        await processed.close()
    full = time.perf_counter()
    await status_counts(engine)
    return {
        "first_read_ms": round(first * 1000, 1),
        "stats": quantiles(stats),
        "status_counts": quantiles(counts),
        "reads": reads,
        "full_count_ms": round((time.perf_counter() - full) * 1000, 1),
    }


def replay_filter(newest: datetime, hours: float) -> MessageFilter:
    return MessageFilter(
        statuses=(Status.PROCESSED, Status.DEAD),
        received_after=newest - timedelta(hours=hours),
        search=build_search(where=[REPLAY_CONDITION]),
    )


async def restore_replayed(engine: AsyncEngine) -> int:
    """Put back the messages a replay moved (kept in REPLAY_SAVED) and drop its attempts."""
    async with engine.begin() as conn:
        if not await conn.scalar(text(f"SELECT to_regclass('{REPLAY_SAVED}') IS NOT NULL")):
            return 0
        moved = await conn.execute(
            text(
                f"""UPDATE inbox_messages m
                       SET status = s.status, processed_at = s.processed_at,
                           next_attempt_at = s.next_attempt_at, budget_start = s.budget_start,
                           locked_until = s.locked_until
                      FROM {REPLAY_SAVED} s WHERE m.id = s.id"""
            )
        )
        await conn.execute(
            text(
                "DELETE FROM inbox_attempts WHERE actor = :actor "
                "AND outcome IN ('admin_replay', 'admin_retry')"
            ),
            {"actor": REPLAY_ACTOR},
        )
        await conn.execute(text(f"DROP TABLE {REPLAY_SAVED}"))
    return int(moved.rowcount)


async def measure_replay(
    engine: AsyncEngine, url: str, newest: datetime, say: Any
) -> dict[str, Any]:
    """A replay (bulk retry, forced) of about REPLAY_TARGET messages found by a search, timed;
    the messages are then put back as they were, so that the database stays reusable."""
    await restore_replayed(engine)  # a run stopped between the two leaves them moved
    hours = REPLAY_TARGET / (PER_HOUR / 36)
    matched = await count_of(engine, replay_filter(newest, hours))
    if matched:
        hours *= REPLAY_TARGET / matched
    filters = replay_filter(newest, hours)
    started = time.perf_counter()
    matched = await count_of(engine, filters)
    dry_run = time.perf_counter() - started
    clauses, params = filters.where()
    async with engine.begin() as conn:
        await conn.execute(
            text(
                f"CREATE TABLE {REPLAY_SAVED} AS SELECT id, status, processed_at, "
                "next_attempt_at, budget_start, locked_until FROM inbox_messages "
                f"WHERE {where_sql(clauses)}"
            ),
            params,
        )
    say(f"  replaying {matched:,} messages ({REPLAY_CONDITION}, last {hours:.1f} h) ...")
    started = time.perf_counter()
    result = await bulk_retry(engine, filters, REPLAY_ACTOR, force=True, dry_run=False)
    took = time.perf_counter() - started
    restored = await restore_replayed(engine)
    async with connected(url) as conn:
        await conn.execute("VACUUM ANALYZE inbox_messages, inbox_attempts")
    return {
        "condition": REPLAY_CONDITION,
        "window_hours": round(hours, 2),
        "matched": matched,
        "dry_run_ms": round(dry_run * 1000, 1),
        "retried": result.retried,
        "seconds": round(took, 2),
        "messages_per_second": round(result.retried / took) if took else None,
        "restored": restored,
    }
