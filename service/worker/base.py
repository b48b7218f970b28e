"""What the worker's parts share: its options, a batch's claim, and the state `Worker` sets,
which `Batches`, `Leasing` and `Gating` (each in a module of its own) read and call."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, fields

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.flow import Change, Gates
from service.core.metrics import Metrics
from service.core.settings import Settings
from service.processing.gates import DestinationGates
from service.processing.pipeline import Pipeline
from service.sources.config_file import InboxConfig
from service.store.results import AttemptResult, DestinationResult, MessageRow


@dataclass(frozen=True)
class WorkerOptions:
    concurrency: int = 4
    batch_size: int = 100
    poll_seconds: float = 2.0
    grace_seconds: float = 30.0
    lease_margin_seconds: float = 30.0
    linger_seconds: float = 0.05
    # The claim loops that run while deliveries arrive (None: half the cores, at least one).
    ingest_concurrency: int | None = None
    # Deliveries count as arriving until this long after the last one was committed.
    ingest_quiet_seconds: float = 1.0

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerOptions:
        """Each option from its setting, `worker_<option>` (INBOX_WORKER_<OPTION>)."""
        return cls(**{f.name: getattr(settings, f"worker_{f.name}") for f in fields(cls)})

    @property
    def loops_while_ingesting(self) -> int:
        """How many claim loops run while deliveries are arriving: on a machine of few cores
        ingest's HTTP process and the database's backends for it share them with the worker's,
        and ingest answers senders who wait (bench/backlog --ingest)."""
        default = max(1, (os.cpu_count() or 2) // 2)
        return min(self.concurrency, self.ingest_concurrency or default)


@dataclass
class Claimed:
    """A batch's messages, whose attempts are counted before their handlers run.

    `leased`: by `claim_due`, which leases each row (`processing` until `locked_until`): the
    messages that run alone, and forwards. Otherwise by `lock_due` and `record_claims`: the
    batch's first transaction locks its due rows and fills `rows` once their claims are
    committed; a rerun locks them again by their claims.
    """

    leased: bool
    rows: list[MessageRow] = field(default_factory=list)
    locked: bool = False  # lock_due has run (the first transaction)
    # One rate-limited source's claim: its lease, and how many its tokens allow.
    sources: dict[str, float] | None = None
    limit: int | None = None
    # The admissions of its named destinations' rate limits and breakers, made once for the
    # batch and its reruns (`service.processing.gates`).
    gates: DestinationGates | None = None
    # Of leased rows, each message's forward destinations' outcomes, made before the batch's
    # transaction began (`Leasing._run_fanout`).
    forwarded: dict[int, dict[str, DestinationResult]] | None = None


class WorkerBase:
    """The worker's state and the steps its parts call on one another (each defined by one
    part; `Worker` combines them)."""

    engine: AsyncEngine
    metrics: Metrics | None
    retention: InboxConfig | None
    pipelines: dict[str, Pipeline]
    options: WorkerOptions
    actor: str
    _http: httpx.AsyncClient | None
    _leases: dict[str, float]
    _gates: dict[str, Gates]
    _gated_backlog: dict[str, bool]
    _leased: set[str]
    _free: dict[str, float]
    _isolate_until: dict[str, float]
    _ordered: set[str]
    _keyed: set[str]
    _claim_again: bool
    _notices: set[asyncio.Task[None]]

    async def _run_handlers(self, claimed: Claimed) -> int:
        raise NotImplementedError  # Batches

    async def _run_leased(self, rows: list[MessageRow]) -> None:
        raise NotImplementedError  # Leasing

    async def _forward(
        self, rows: list[MessageRow], *, failed_probe_waits: float | None = None
    ) -> list[AttemptResult]:
        raise NotImplementedError  # Leasing

    def _count(self, rows: list[MessageRow], results: list[AttemptResult]) -> None:
        raise NotImplementedError  # Batches

    def _breaker_changed(
        self, source: str, change: Change, error: str | None, cooldown: float, destination: str = ""
    ) -> None:
        raise NotImplementedError  # Gating

    def _wake_later(self, seconds: float) -> None:
        raise NotImplementedError  # Gating

    def _log_alone(self, rows: list[MessageRow]) -> None:
        raise NotImplementedError  # Worker

    def wake_one(self) -> None:
        raise NotImplementedError  # Worker
