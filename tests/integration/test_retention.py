"""Retention: prune deletes exactly the aged eligible rows, respects floors, refuses short ones."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from service.cli import main
from service.core.db import create_engine
from service.core.metrics import Metrics
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config, unconfigured_source_floor_days
from service.worker.retention import prune
from tests.admin_seed import AUTH, TOKEN, seed, seed_attempt
from tests.conftest import AppFactory

DAY = timedelta(days=1)


def config(**retention: Any) -> dict[str, Any]:
    return {
        "sources": {
            "hooks": {"kind": "generic", "id_header": "X-Id"},
            "other": {"kind": "generic", "id_header": "X-Id"},
        },
        "retention": retention,
    }


async def remaining(db: asyncpg.Connection) -> set[str]:
    return {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}


async def run_prune(database_url: str, raw: dict[str, Any], **options: Any) -> Any:
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        return await prune(engine, parse_inbox_config(raw), **options)
    finally:
        await engine.dispose()


async def test_prune_deletes_exactly_the_aged_finished_rows(
    database_url: str, db: asyncpg.Connection
) -> None:
    old_processed = await seed(db, "old-processed", status="processed", age=11 * DAY)
    await seed_attempt(db, old_processed, 1, "processed", age=11 * DAY)
    await seed(db, "old-discarded", source="other", status="discarded", age=11 * DAY)
    young = await seed(db, "young-processed", status="processed", age=9 * DAY)
    await seed_attempt(db, young, 1, "processed", age=9 * DAY)
    keep = {
        "young-processed": young,
        "old-dead": await seed(db, "old-dead", status="dead", age=400 * DAY),
        "old-pending": await seed(db, "old-pending", status="pending", age=40 * DAY),
        "old-retrying": await seed(db, "old-retrying", status="retrying", age=40 * DAY),
        "old-processing": await seed(db, "old-processing", status="processing", age=40 * DAY),
        # First received long ago but redelivered yesterday: still inside the 3-day floor.
        "redelivered": await seed(
            db, "redelivered", status="processed", age=40 * DAY, last_received_age=DAY
        ),
    }
    report = await run_prune(database_url, config(processed_days=10))
    assert await remaining(db) == set(keep)
    assert report.total == 2
    assert report.by_status == {"processed": 1, "discarded": 1, "dead": 0}
    assert report.by_source == {"hooks": 1, "other": 1}
    # The deleted row's attempt went with it; the kept row's stayed.
    assert await db.fetchval("SELECT array_agg(message_id) FROM inbox_attempts") == [young]
    again = await run_prune(database_url, config(processed_days=10))
    assert again.total == 0


async def test_dead_rows_go_only_with_dead_days(database_url: str, db: asyncpg.Connection) -> None:
    await seed(db, "dead-60", status="dead", age=60 * DAY)
    await seed(db, "dead-20", status="dead", age=20 * DAY)
    await seed(db, "processed-60", status="processed", age=60 * DAY)
    report = await run_prune(database_url, config(processed_days=30, dead_days=30))
    assert await remaining(db) == {"dead-20"}
    assert report.by_status == {"processed": 1, "discarded": 0, "dead": 1}


async def test_rows_of_unconfigured_sources_keep_the_longest_floor(
    database_url: str, db: asyncpg.Connection
) -> None:
    floor = unconfigured_source_floor_days()
    await seed(db, "inside-floor", source="removed", status="processed", age=(floor - 0.5) * DAY)
    await seed(db, "outside-floor", source="removed", status="processed", age=(floor + 0.5) * DAY)
    await seed(db, "configured", source="hooks", status="processed", age=(floor + 0.5) * DAY)
    # processed_days below every floor is allowed with no source configured, but the floor holds.
    report = await run_prune(database_url, {"retention": {"processed_days": 0.5}})
    assert await remaining(db) == {"inside-floor"}
    assert report.by_source == {"(unconfigured)": 2}


async def test_prune_works_in_bounded_batches_and_counts_metrics(
    database_url: str, db: asyncpg.Connection
) -> None:
    for i in range(7):
        await seed(db, f"old-{i}", status="processed", age=40 * DAY)
    metrics = Metrics()
    report = await run_prune(database_url, config(), batch_size=2, metrics=metrics)
    assert report.total == 7
    assert await remaining(db) == set()
    rendered = metrics.render().decode()
    assert 'webhook_inbox_pruned_rows_total{status="processed"} 7.0' in rendered


async def test_prune_skips_rows_another_transaction_holds(
    database_url: str, db: asyncpg.Connection
) -> None:
    held = await seed(db, "held", status="processed", age=40 * DAY)
    await seed(db, "free", status="processed", age=40 * DAY)
    async with db.transaction():
        await db.execute("SELECT 1 FROM inbox_messages WHERE id = $1 FOR UPDATE", held)
        report = await run_prune(database_url, config())
    assert report.total == 1
    assert await remaining(db) == {"held"}


async def test_admin_prune_reports_what_it_deleted(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await seed(db, "old", status="processed", age=40 * DAY)
    await seed(db, "new", status="processed")
    async with client_for(config(), admin_tokens=[TOKEN]) as client:
        response = await client.post("/admin/prune", headers=AUTH)
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200
    assert response.json() == {
        "deleted": 1,
        "by_status": {"processed": 1, "discarded": 0, "dead": 0},
        "by_source": {"hooks": 1},
    }
    assert await remaining(db) == {"new"}
    assert 'webhook_inbox_pruned_rows_total{status="processed"} 1.0' in metrics


def test_cli_prune_prints_what_it_deleted(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import asyncio

    async def arrange() -> None:
        conn = await asyncpg.connect(database_url.replace("+asyncpg", ""))
        try:
            await seed(conn, "old", status="discarded", age=40 * DAY)
        finally:
            await conn.close()

    path = tmp_path / "inbox.toml"
    path.write_text('[sources.hooks]\nkind = "generic"\nid_header = "X-Id"\n')
    monkeypatch.setenv("INBOX_CONFIG", str(path))
    monkeypatch.setenv("DATABASE_URL", database_url)
    asyncio.run(arrange())
    main(["prune"])
    out = capsys.readouterr().out
    assert "pruned 1 rows: processed=0 discarded=1 dead=0 (hooks=1)" in out


async def test_prune_periodically_prunes_until_stopped(
    database_url: str, db: asyncpg.Connection
) -> None:
    import asyncio

    from service.worker.retention import prune_periodically

    await seed(db, "old", status="processed", age=40 * DAY)
    engine = create_engine(database_url, Settings(database_url=database_url))
    stop = asyncio.Event()
    try:
        task = asyncio.create_task(
            prune_periodically(engine, parse_inbox_config(config()), stop, interval_seconds=60)
        )
        for _ in range(100):
            if not await remaining(db):
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    finally:
        await engine.dispose()
    assert await remaining(db) == set()
