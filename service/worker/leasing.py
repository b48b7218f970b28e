"""Leased messages: a source's forward, and the named destinations' forwards called before
the batch's transaction, with no transaction open while an HTTP call is out."""

from __future__ import annotations

import asyncio
import logging

from service.processing.fanout import expect_gated, forward_destinations
from service.processing.forward import forward_message_traced
from service.processing.gates import DestinationGates, probe_failed
from service.processing.ordering import behind, key_of, run_in_order, runs
from service.store.attempts import load_destinations, record_results
from service.store.results import AttemptResult, MessageRow
from service.store.savepoints import short_transaction
from service.worker.base import Claimed, WorkerBase

log = logging.getLogger("service.worker")


class Leasing(WorkerBase):
    """Leased messages: forwards called with no transaction open."""

    async def _run_leased(self, rows: list[MessageRow]) -> None:
        """Run leased rows of Python handlers' sources, or of sources whose named destinations
        forward (`_run_fanout`); a source's own forward goes by `_forward`."""
        fanning = [row for row in rows if self.pipelines[row.source].forwards_in_batch]
        handled = [row for row in rows if row not in fanning]
        if handled:
            await self._run_handlers(Claimed(leased=True, rows=handled))
        if fanning:
            await self._run_fanout(fanning)

    async def _run_fanout(self, rows: list[MessageRow]) -> None:
        """Leased messages whose named destinations forward: first their forwards, called with
        no transaction open (as a source's forward is), then one transaction that runs their
        handler destinations and records every destination's outcome, the forwards' with
        them. A key's messages after the first of this batch are put back unattempted: a
        forward of a later one must not go out before an earlier one's handlers commit."""
        first: dict[tuple[str, str], MessageRow] = {}
        behind_first: list[MessageRow] = []
        for row in rows:
            key = key_of(row)
            if key is not None and first.setdefault(key, row) is not row:
                behind_first.append(row)
        if behind_first:
            await record_results(
                self.engine, [behind(row) for row in behind_first], self.actor, leased=True
            )
        rows = [row for row in rows if row not in behind_first]
        async with short_transaction(self.engine) as conn:
            await load_destinations(conn, rows)
        gates = None
        if any(self.pipelines[row.source].gated for row in rows):
            gates = DestinationGates(self.engine, self.pipelines)
            for row in rows:
                expect_gated(gates, self.pipelines[row.source], row)
        assert self._http is not None
        http = self._http
        made = await asyncio.gather(
            *(forward_destinations(self.pipelines[row.source], row, http, gates) for row in rows)
        )
        forwarded = {row.id: outcomes for row, outcomes in zip(rows, made, strict=True)}
        await self._run_handlers(Claimed(leased=True, rows=rows, gates=gates, forwarded=forwarded))

    async def _forward(
        self, rows: list[MessageRow], *, failed_probe_waits: float | None = None
    ) -> list[AttemptResult]:
        """Forward `rows` (leased) and record their outcomes; the outcomes as forwarded.
        `failed_probe_waits`: the rows are a breaker's probe, and one that fails as the
        breaker counts failures gives its attempt back and waits this long (`probe_failed`)."""
        assert self._http is not None
        http = self._http

        async def forward(row: MessageRow) -> AttemptResult:
            config = self.pipelines[row.source].config
            return await forward_message_traced(http, row, row.attempts + 1, config)

        # Each key's run in order, the keys and the unkeyed messages concurrently.
        ran = await asyncio.gather(*(run_in_order(run, forward) for run in runs(rows)))
        results = [result for run in ran for result in run]
        kept = results
        if failed_probe_waits is not None:
            kept = [probe_failed(r, failed_probe_waits, rows) for r in results]
        recorded = await record_results(self.engine, kept, self.actor, leased=True)
        if self._ordered and any(row.source in self._ordered for row in rows):
            self._claim_again = True
        self._count(rows, [r for r in kept if r.id in recorded])
        for result in results:
            if result.id not in recorded:
                log.warning(
                    "forward outcome dropped: the lease expired and another attempt took over",
                    extra={"id": result.id, "attempt": result.attempt},
                )
        return list(results)
