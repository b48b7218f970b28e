"""Gated sources: each claimed as its rate limit and circuit breaker admit (`core.flow`), and
what a breaker's change tells the metrics, the log and the alert webhooks."""

from __future__ import annotations

import asyncio
import logging

from service.core.flow import BreakerState, Change
from service.core.schema import Status
from service.processing.gates import breaks_circuit
from service.store import flow
from service.store.claims import claim_due
from service.store.flow import gate_key
from service.store.results import AttemptResult
from service.worker.base import Claimed, WorkerBase
from service.worker.dead_letter_alerts import (
    breaker_text,
    send_breaker_notice,
)

log = logging.getLogger("service.worker")


class Gating(WorkerBase):
    """Claims of gated sources, and what their breakers' changes tell operators."""

    async def _run_gated(self, source: str, want: int, *, alone: bool = False) -> int:
        """Claim and run as many of `source`'s due messages (of `want`) as its gates admit now
        (`core.flow.admit`: its circuit breaker, then its rate limit's bucket, shared by every
        process on the database), then settle: tokens not used go back, and a forward's
        outcomes move its breaker. The number claimed. A message over the limit or held by
        an open breaker waits as it is, no attempt spent, and a wake-up is set for when it
        may run. A probe that fails is the breaker's, not its message's: its attempt is given
        back (`_forward`). `alone`: among the messages whose last attempt never finished.
        """
        pipeline, gates = self.pipelines[source], self._gates[source]
        leases = {source: self._leases[source]}
        key = gate_key(source)
        admission = await flow.admit(self.engine, key, gates, want, leases[source])
        if not admission.allowed:
            if self._gated_backlog[source] and not alone:
                self._wake_later(admission.wait_seconds)
                if self.metrics is not None and admission.breaker in (None, BreakerState.CLOSED):
                    self.metrics.rate_limit_waited(source, admission.wait_seconds)
            return 0
        failed: list[AttemptResult] = []
        succeeded = 0
        if source not in self._leased and not alone:
            limit = admission.allowed
            claimed = await self._run_handlers(Claimed(leased=False, sources=leases, limit=limit))
        else:
            rows = await claim_due(
                self.engine, leases, admission.allowed, alone=alone, keyed=self._keyed
            )
            claimed = len(rows)
            if alone:
                self._log_alone(rows)
            if rows and pipeline.forward is None:
                await self._run_leased(rows)
            elif rows:
                probe = gates.cooldown_seconds if admission.probe else None
                results = await self._forward(rows, failed_probe_waits=probe)
                failed = [r for r in results if breaks_circuit(r.status, r.error_type, r.error)]
                succeeded = sum(r.status == Status.PROCESSED for r in results)
        if self.metrics is not None and claimed and gates.per_second is not None:
            self.metrics.rate_limit_claimed(source, claimed)
        error = failed[-1].error if failed else None
        outcomes = flow.Outcomes(admission, claimed, len(failed), succeeded, error)
        change = await flow.settle(self.engine, key, gates, outcomes)
        if change is not None:
            self._breaker_changed(source, change, error, gates.cooldown_seconds)
        if alone:
            return claimed
        # Claimed all it was admitted: more may be due, once the gates let them.
        self._gated_backlog[source] = claimed == admission.allowed
        if claimed == admission.allowed and admission.allowed < want:
            if admission.wait_seconds:
                self._wake_later(admission.wait_seconds)
            else:
                self._claim_again = True  # capped by the breaker, not by the backlog
        return claimed

    def _breaker_changed(
        self, source: str, change: Change, error: str | None, cooldown: float, destination: str = ""
    ) -> None:
        """A forward's breaker (the source's own, or a named `destination`'s) changed: count it;
        when it opened, log and announce it; while open, look again when its cool-down ends."""
        if self.metrics is not None:
            self.metrics.breaker_changed(source, change, destination)
        if change != "closed":
            self._wake_later(cooldown)
        if change != "opened":
            return
        log.warning(
            "circuit opened: the forward is left alone for its cool-down",
            extra={
                "source": source,
                "destination": destination or None,
                "cooldown_s": cooldown,
                "error": error,
            },
        )
        self._announce_breaker(source, error, cooldown, destination)

    def _announce_breaker(
        self, source: str, error: str | None, cooldown: float, destination: str = ""
    ) -> None:
        """Tell the `[alerts]` webhooks that a forward's circuit opened (this process opened
        it: one notice per opening), in a task of its own, so no claim waits for the webhook."""
        alerts = self.retention.alerts if self.retention is not None else None
        if alerts is None or not alerts.webhooks or self._http is None:
            return
        text = breaker_text(source, error, cooldown, destination)
        fields: dict[str, object] = {"source": source, "error": error, "cooldown_seconds": cooldown}
        if destination:
            fields["destination"] = destination
        task = asyncio.create_task(send_breaker_notice(self._http, alerts, text, fields))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    def _wake_later(self, seconds: float) -> None:
        asyncio.get_running_loop().call_later(max(seconds, 0.001), self.wake_one)
