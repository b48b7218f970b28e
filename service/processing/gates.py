"""Admission of named destinations' runs: each destination's rate limit and, for a forward, its
circuit breaker, shared by every process on the database (the same tables as a source's own:
`store.flow`, under the key `source/destination`).

A batch asks before each gated destination runs for a message (`admit`): the answer is to run
now, or to wait so many seconds. A run that waits is deferred (`fanout.run_destinations`): the
destination stays pending, no attempt spent, and the message comes due again when it may run;
the message's other destinations are not held. One `DestinationGates` serves a batch and its
reruns (an optimistic batch rolled back and run again isolated), so an admission is asked for
once per (message, destination); `settle` returns what was taken and not used, and counts the
forwards' outcomes.

A run held by its rate limit is given a slot in the destination's queue (`core.flow.admit`,
`queue`): the backlog of a slow destination comes due one token apart, each run once, so it
costs the database and the worker's claims about its rate, not its depth, and a run that
reaches the destination for the first time queues behind those already waiting. The slot is
the run's (`inbox_destinations.slot_at`, its token taken when it was given): when it comes,
the run runs on it, asking the breaker only; claimed before it, it waits for it again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from service.core import flow as rules
from service.core.schema import Status
from service.processing.pipeline import Destination, Pipeline
from service.store import flow
from service.store.flow import gate_key
from service.store.results import DEFERRED, AttemptResult, MessageRow

# Failures that say the endpoint is down, not that it refused the message: they count
# towards opening its circuit.
CIRCUIT_FAILURES = frozenset({"ForwardConnectionError", "ForwardTimeout"})
RATE_LIMITED = "rate limited"
CIRCUIT_OPEN = "circuit open"
# A closed breaker's failures left are all held by calls in flight (its bound on them).
IN_FLIGHT = "circuit breaker: the failures it allows are held by calls in flight"


def breaks_circuit(status: Status, error_type: str | None, error: str | None) -> bool:
    """Whether a forward's outcome says its endpoint is down (it counts towards the breaker)."""
    if status == Status.PROCESSED:
        return False
    if error_type in CIRCUIT_FAILURES:
        return True
    return error_type == "ForwardFailed" and (error or "").startswith("HTTP 5")


def probe_failed(
    result: AttemptResult, wait_seconds: float, rows: Iterable[MessageRow]
) -> AttemptResult:
    """A source's forward that was its breaker's probe: if it failed as the breaker counts
    failures, the failure is the breaker's, not the message's, so its attempt is given back
    and it waits `wait_seconds` (the cool-down) as it was, instead of spending its attempts
    on an outage (a named destination's probe is deferred the same way, `forwarded`)."""
    if not breaks_circuit(result.status, result.error_type, result.error):
        return result
    row = next(r for r in rows if r.id == result.id)
    return replace(
        result,
        status=row.status,
        outcome=DEFERRED,
        delay_seconds=wait_seconds,
        deferred=True,
        unfinished=False,
    )


@dataclass(frozen=True)
class Deferral:
    """A run that may not start now: how long it waits, and why; `slot_at`: the slot in its
    destination's queue it holds (its token taken), if it has one."""

    wait_seconds: float
    reason: str
    slot_at: datetime | None = None


@dataclass(frozen=True)
class BreakerChange:
    """A destination's breaker after a batch's forwards: opened, reopened or closed."""

    source: str
    destination: str
    change: rules.Change
    error: str | None
    cooldown_seconds: float


@dataclass(frozen=True)
class Settled:
    """What a batch's admissions came to: the breakers that changed, the runs admitted and
    the seconds waited per rate-limited destination, and when the first deferred run is due
    (None: none was deferred)."""

    changes: list[BreakerChange]
    claimed: dict[tuple[str, str], int]
    waited: dict[tuple[str, str], float]
    next_due: float | None


@dataclass
class _Gate:
    """One destination's admission in this batch, and what its runs came to."""

    admission: rules.Admission
    left: int  # runs on a token of this admission
    slotted_left: int  # runs on their slot's token
    at: datetime  # when it was answered (the worker's clock, as the slots it gives)
    used: int = 0
    used_slotted: int = 0
    deferred: int = 0
    failed: int = 0
    succeeded: int = 0
    error: str | None = None


@dataclass
class DestinationGates:
    """The admissions of one batch (and its reruns)."""

    engine: AsyncEngine
    pipelines: Mapping[str, Pipeline]
    # Runs still to be asked for, per (source, destination): what a gate is asked for at
    # once, so that a batch costs a round trip per destination, not per run.
    expected: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Of those, the runs that never asked before (no state row): they queue behind the others;
    # and the runs whose slot has come (`core.flow.slot_holds`, as judged when expected).
    fresh: Counter[tuple[str, str]] = field(default_factory=Counter)
    slotted: Counter[tuple[str, str]] = field(default_factory=Counter)
    holds: dict[tuple[int, str], bool | None] = field(default_factory=dict)
    answers: dict[tuple[int, str], Deferral | None] = field(default_factory=dict)
    gates: dict[tuple[str, str], _Gate] = field(default_factory=dict)
    changes: list[BreakerChange] = field(default_factory=list)
    next_due: float | None = None
    claimed: Counter[tuple[str, str]] = field(default_factory=Counter)
    waited: dict[tuple[str, str], float] = field(default_factory=dict)
    asking: asyncio.Lock = field(default_factory=asyncio.Lock)

    def expect(self, row: MessageRow, destinations: Iterable[Destination]) -> None:
        """Count the gated runs of `row` the batch will ask for (its due destinations)."""
        for destination in destinations:
            if destination.gated and (row.id, destination.name) not in self.answers:
                key = (row.source, destination.name)
                holds = self._holds(row, destination)
                if holds is False:
                    continue  # it waits for its slot, asking nothing
                self.expected[key] += 1
                if holds:
                    self.slotted[key] += 1
                elif destination.name not in (row.destinations or {}):
                    self.fresh[key] += 1

    def _holds(self, row: MessageRow, destination: Destination) -> bool | None:
        """Whether the run's slot has come (True), is ahead (False), or it has none to hold;
        judged once, so that the run is counted and admitted alike."""
        memo = (row.id, destination.name)
        if memo not in self.holds:
            slot = row.destination_state(destination.name).slot_at
            limit = destination.gates if destination.rate_limit is not None else None
            now = datetime.now(UTC)
            self.holds[memo] = None if limit is None else rules.slot_holds(limit, slot, now)
        return self.holds[memo]

    async def admit(self, row: MessageRow, destination: Destination) -> Deferral | None:
        """None: run `destination` for `row` now; else how long it waits, and why."""
        memo = (row.id, destination.name)
        if memo in self.answers:
            return self.answers[memo]
        key = (row.source, destination.name)
        holds = self._holds(row, destination)
        # Held (True) or ahead (False), the run has a slot (`core.flow.slot_holds`).
        slot = row.destination_state(destination.name).slot_at
        if holds is False:
            # Claimed before its slot (with another destination of its message): it waits.
            assert slot is not None
            wait = max(0.0, (slot - datetime.now(UTC)).total_seconds())
            ahead = self.answers[memo] = Deferral(wait, RATE_LIMITED, slot)
            self.next_due = min(wait, self.next_due or wait)
            return ahead
        # Asked once a batch, for every run expected (`expect`): the forwards of a batch go
        # out at once, so no outcome is known before the last run is admitted, and a second
        # ask would let a breaker admit more calls than failures it has left. Runs past the
        # answer wait for the next batch. Under a lock: concurrent runs share one answer.
        async with self.asking:
            gate = self.gates.get(key) or await self._ask(key, destination)
        if self.expected[key] > 0:
            self.expected[key] -= 1
        if holds and self.slotted[key] > 0:
            self.slotted[key] -= 1
        answer = None
        # While runs are queued ahead, a token is theirs: a first run queues behind them.
        first_ask = destination.name not in (row.destinations or {})
        if holds and gate.slotted_left > 0:
            gate.slotted_left -= 1
            gate.used += 1
            gate.used_slotted += 1
        elif holds:
            assert slot is not None
            answer = self._slot_held(gate, slot)
        elif gate.left > 0 and not (first_ask and gate.admission.queued):
            gate.left -= 1
            gate.used += 1
        else:
            answer = self._deferral(gate, destination, row.id)
        if answer is not None:
            self.next_due = min(answer.wait_seconds, self.next_due or answer.wait_seconds)
        self.answers[memo] = answer
        return answer

    async def _ask(self, key: tuple[str, str], destination: Destination) -> _Gate:
        wanted = max(1, self.expected[key])
        lease = 5.0 + (destination.forward.timeout_seconds * wanted if destination.forward else 0)
        limit = destination.rate_limit
        admission = await flow.admit(
            self.engine,
            gate_key(*key),
            destination.gates,
            wanted,
            lease,
            queue=limit is not None,
            fresh=min(wanted, self.fresh[key]),
            slotted=min(wanted, self.slotted[key]),
        )
        ran = admission.slotted
        self.gates[key] = _Gate(admission, admission.allowed - ran, ran, datetime.now(UTC))
        if limit is not None and (admission.queued or admission.slot_seconds):
            # Runs wait in its queue: look again when the next of them may be due.
            wait = min(rules.QUEUE_RECHECK_SECONDS, 1 / limit.per_second)
            self.next_due = min(wait, self.next_due or wait)
        return self.gates[key]

    @staticmethod
    def _deferral(gate: _Gate, destination: Destination, message: int) -> Deferral:
        """Over what its gates allow now: each deferred run waits for its slot in the
        destination's queue (the admission's first, then one token apart), so that a
        backlog's runs come due one token apart, each once, instead of all at once."""
        gate.deferred += 1
        admission = gate.admission
        limit = destination.rate_limit
        recheck = admission.wait_seconds or rules.PROBE_RECHECK_SECONDS
        if admission.breaker not in (None, rules.BreakerState.CLOSED):
            return Deferral(recheck, CIRCUIT_OPEN)
        if limit is None:
            return Deferral(recheck, IN_FLIGHT)
        first = admission.slot_seconds or admission.wait_seconds or 1 / limit.per_second
        wait = first + (gate.deferred - 1) / limit.per_second
        # The slots the admission gave (their tokens taken); a run past them (the horizon,
        # or more runs than the batch expected) has none and asks again when it comes due.
        slot = gate.at + timedelta(seconds=wait) if gate.deferred <= admission.slots else None
        return Deferral(rules.parked(wait, message), RATE_LIMITED, slot)

    @staticmethod
    def _slot_held(gate: _Gate, slot: datetime) -> Deferral:
        """A run whose slot has come, held back by its breaker: open, it waits for the next
        probe and its slot is lost (its token with it); closed (the failures it allows are
        held by calls in flight), it keeps its slot and looks again soon."""
        admission = gate.admission
        if admission.breaker not in (None, rules.BreakerState.CLOSED):
            return Deferral(admission.wait_seconds or rules.PROBE_RECHECK_SECONDS, CIRCUIT_OPEN)
        # (No breaker: a run the batch did not expect, past the admission's answer.)
        reason = RATE_LIMITED if admission.breaker is None else IN_FLIGHT
        return Deferral(rules.RESERVED_RECHECK_SECONDS, reason, slot)

    def forwarded(
        self,
        row: MessageRow,
        destination: Destination,
        status: Status,
        error_type: str | None,
        error: str | None,
    ) -> Deferral | None:
        """Count a forward's outcome towards its destination's breaker. A probe that failed is
        the breaker's, not its message's: the run is deferred instead (until the breaker's
        next probe, no attempt spent), so that an outage, however long, sends no message to
        the dead letters by its probes."""
        gate = self.gates.get((row.source, destination.name))
        if gate is None or destination.forward is None:
            return None
        if breaks_circuit(status, error_type, error):
            gate.failed += 1
            gate.error = error or error_type
            if gate.admission.probe:
                wait = destination.forward.breaker_cooldown_seconds
                self.next_due = min(wait, self.next_due or wait)
                return Deferral(wait, f"{CIRCUIT_OPEN}: the probe failed: {gate.error}")
        elif status == Status.PROCESSED:
            gate.succeeded += 1
        return None

    async def settle(self) -> Settled:
        """After the batch: give back the tokens taken and not used, and count the forwards'
        outcomes."""
        for key in list(self.gates):
            await self._settle(key)
        claimed = {key: n for key, n in self.claimed.items() if n}
        return Settled(self.changes, claimed, self.waited, self.next_due)

    async def _settle(self, key: tuple[str, str]) -> None:
        """Count the runs of `key` since it was last admitted; a breaker's change is kept for
        `settle` to return."""
        gate = self.gates.pop(key)
        destination = self.pipelines[key[0]].destination(key[1])
        if destination.rate_limit is not None:
            self.claimed[key] += gate.used
            # Runs deferred for want of tokens (not by the breaker): the rate limit's wait.
            closed = gate.admission.breaker in (None, rules.BreakerState.CLOSED)
            if gate.deferred and closed:
                self.waited[key] = gate.admission.wait_seconds
        outcomes = flow.Outcomes(
            gate.admission, gate.used, gate.failed, gate.succeeded, gate.error, gate.used_slotted
        )
        change = await flow.settle(self.engine, gate_key(*key), destination.gates, outcomes)
        if change is not None:
            self.changes.append(
                BreakerChange(
                    key[0], key[1], change, gate.error, destination.gates.cooldown_seconds
                )
            )
