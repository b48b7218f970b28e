"""bench/search's ingest part: what the search indexes (migration 0025) cost the insert path.

Two databases on the bench's server, both migrated to head, one with the three search indexes
dropped; one `serve --no-migrate --no-worker` on each, started side by side; then rounds, each a
cell on each (their order alternating), of signed deliveries (standard-webhooks) with bodies of
about 1 KB of Stripe-shaped JSON under wrk, as bench/ingest loads a cell. The tables are not
emptied between cells: the indexes grow over the run as an inbox's do.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import secrets
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.load import ensure_wrk, run_wrk, write_requests
from bench.pg import BenchPostgres, connected, migrate
from bench.servers import Server
from bench.systems import console_script

ARMS = ("indexed", "unindexed")
SEARCH_INDEXES = (
    "inbox_messages_payload_idx",
    "inbox_messages_headers_idx",
    "inbox_messages_message_id_prefix_idx",
)
SOURCES_TOML = """
[sources.stripe-shaped]
kind = "standard-webhooks"
secrets = ["{secret}"]
"""
PATH = "/webhooks/stripe-shaped"

# About 1 KB, as bench/search_rows.py's stripe bodies: the GIN entries a delivery adds grow
# with its body, so bench/load's 330-byte default would understate them.
BODY = json.dumps(
    {
        "id": "{id}",
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1764460800,
        "data": {
            "object": {
                "id": "ch_3QHbench",
                "object": "charge",
                "amount": 4200,
                "amount_captured": 4200,
                "amount_refunded": 0,
                "balance_transaction": "txn_3QHbench",
                "billing_details": {
                    "address": {
                        "city": "Springfield",
                        "country": "US",
                        "line1": "742 Main Street",
                        "line2": None,
                        "postal_code": "60042",
                        "state": "IL",
                    },
                    "email": "cust42@example.com",
                    "name": "Customer 42",
                    "phone": None,
                },
                "captured": True,
                "currency": "usd",
                "customer": "cus_42",
                "description": "Order ord_3QHbench",
                "invoice": "in_3QHbench",
                "livemode": False,
                "metadata": {"order_id": "ord_3QHbench", "cart_id": "cart_9f2c"},
                "paid": True,
                "payment_intent": "pi_3QHbench",
                "payment_method": "pm_3QHbench",
                "payment_method_details": {
                    "card": {
                        "brand": "visa",
                        "country": "US",
                        "exp_month": 7,
                        "exp_year": 2029,
                        "fingerprint": "Xt5EWLLDS7FJjR1c",
                        "funding": "credit",
                        "last4": "4242",
                        "network": "visa",
                    },
                    "type": "card",
                },
                "receipt_email": "cust42@example.com",
                "receipt_url": "https://pay.stripe.com/receipts/acct_1AcmeStore/ch_3QHbench",
                "statement_descriptor": "ACME STORE",
                "status": "succeeded",
            }
        },
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": "req_3QHbench", "idempotency_key": "5b1f0c3e-bench"},
        "type": "charge.succeeded",
    }
)


async def prepare(pg: BenchPostgres) -> dict[str, str]:
    """The two arms' databases, migrated; the unindexed one without the search indexes."""
    urls = {}
    for arm in ARMS:
        urls[arm] = await pg.create_database(f"bench_search_{arm}")
        await migrate(urls[arm])
    async with connected(urls["unindexed"]) as conn:
        await conn.execute(f"DROP INDEX {', '.join(SEARCH_INDEXES)}")
    return urls


async def stored(url: str) -> int:
    async with connected(url) as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM inbox_messages")
    return count


def cell(
    wrk: str, server: Server, url: str, tag: str, args: argparse.Namespace, work: Path, key: bytes
) -> dict[str, Any]:
    per_thread = math.ceil(args.max_rps * args.ingest_seconds / args.threads)
    prefix, body = write_requests(work / "req", tag, per_thread, args.threads, key, BODY)
    before = asyncio.run(stored(url))
    result = run_wrk(
        wrk,
        server.url + PATH,
        connections=args.connections,
        threads=args.threads,
        duration=args.ingest_seconds,
        requests=prefix,
        body_template=body,
        dup_fraction=0.0,
        ack_log=work / "ack",
    )
    rows = asyncio.run(stored(url)) - before
    return {
        "rps": round(result.rps, 1),
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "requests": result.requests,
        "non_2xx": result.non_2xx,
        "socket_errors": result.socket_errors,
        "wrapped": result.wrapped,
        "acked": result.acked,
        "stored": rows,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def run(args: argparse.Namespace, say: Any) -> dict[str, Any]:
    """Interleaved rounds of the two arms; each round's ratios, and their median and range."""
    wrk = ensure_wrk()
    key = secrets.token_bytes(32)
    rounds: list[dict[str, Any]] = []
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-bench-") as tmp:
        work = Path(tmp)
        urls = asyncio.run(prepare(pg))
        sources = work / "sources.toml"
        secret = "whsec_" + base64.b64encode(key).decode()
        toml = SOURCES_TOML.replace("{secret}", secret)
        # Opted in, the source's payloads enter the payload index; else only the headers and
        # the id prefix are indexed (the payload index holds none of its rows).
        sources.write_text(toml + ("search_payload = true\n" if args.search_payload else ""))
        try:
            with contextlib.ExitStack() as stack:
                servers = {}
                for arm in ARMS:
                    env = {
                        "DATABASE_URL": urls[arm],
                        "INBOX_CONFIG": str(sources),
                        "INBOX_DATA_DIR": str(work / f"data-{arm}"),
                        "INBOX_ADMIN_TOKENS": secrets.token_hex(16),
                        "INBOX_LOG_LEVEL": "INFO",
                    }
                    command = [
                        *console_script("webhook-inbox"),
                        "serve",
                        "--no-migrate",
                        "--no-worker",
                    ]
                    server = Server(arm, command, env, work / f"{arm}.log", sample_memory=False)
                    servers[arm] = stack.enter_context(server)
                for arm in ARMS:  # warm-up: a short cell each, not counted
                    cell(wrk, servers[arm], urls[arm], f"warm-{arm}", warmup(args), work, key)
                for number in range(args.ingest_rounds):
                    order = ARMS if number % 2 == 0 else ARMS[::-1]
                    figures = {
                        arm: cell(wrk, servers[arm], urls[arm], f"r{number}-{arm}", args, work, key)
                        for arm in order
                    }
                    figures["rps_ratio"] = round(
                        figures["indexed"]["rps"] / figures["unindexed"]["rps"], 3
                    )
                    figures["p99_ratio"] = round(
                        figures["indexed"]["p99_ms"] / figures["unindexed"]["p99_ms"], 3
                    )
                    rounds.append(figures)
                    say(
                        f"  round {number + 1}: indexed {figures['indexed']['rps']:,.0f} req/s "
                        f"p99 {figures['indexed']['p99_ms']:.1f} ms; unindexed "
                        f"{figures['unindexed']['rps']:,.0f} req/s "
                        f"p99 {figures['unindexed']['p99_ms']:.1f} ms; ratio {figures['rps_ratio']}"
                    )
        finally:
            for url in urls.values():
                asyncio.run(pg.drop_database(url))
    return {
        "search_payload": args.search_payload,
        "body_bytes": len(BODY),
        "seconds_a_cell": args.ingest_seconds,
        "connections": args.connections,
        "rounds": rounds,
        "rps_ratio": spread([r["rps_ratio"] for r in rounds]),
        "p99_ratio": spread([r["p99_ratio"] for r in rounds]),
        "rps": {arm: spread([r[arm]["rps"] for r in rounds]) for arm in ARMS},
        "p99_ms": {arm: spread([r[arm]["p99_ms"] for r in rounds]) for arm in ARMS},
        "all_stored": all(
            r[arm]["stored"] >= r[arm]["acked"] and not r[arm]["non_2xx"]
            for r in rounds
            for arm in ARMS
        ),
    }


def warmup(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "ingest_seconds": 3})
