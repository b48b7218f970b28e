"""An ordering key's run in a batch (service/processing/ordering.py): grouped by key in id
order, run in turn, and stopped at the first message that does not succeed, the rest deferred
with their attempt given back."""

from __future__ import annotations

from datetime import UTC, datetime

from service.core.status import Status
from service.processing.ordering import BEHIND, Stopped, behind, run_in_order, runs
from service.store.results import AttemptResult, MessageRow


def row(id_: int, key: str | None, status: Status = Status.PENDING) -> MessageRow:
    return MessageRow(
        id_, "hooks", f"m{id_}", None, 2, {}, b"{}", None, ordering_key=key, status=status
    )


def test_runs_group_each_key_in_id_order_and_leave_unkeyed_messages_alone() -> None:
    grouped = runs([row(5, "a"), row(1, "a"), row(2, None), row(3, "b"), row(4, None)])
    assert [[r.id for r in g] for g in grouped] == [[1, 5], [2], [3], [4]]


def test_the_same_key_of_another_source_is_another_run() -> None:
    other = row(2, "a")
    other.source = "shop"
    assert [[r.id for r in g] for g in runs([row(1, "a"), other])] == [[1], [2]]


async def test_a_run_stops_at_its_first_failure_and_defers_the_rest() -> None:
    ran: list[int] = []

    async def attempt(r: MessageRow) -> AttemptResult:
        ran.append(r.id)
        status = Status.RETRYING if r.id == 2 else Status.PROCESSED
        now = datetime.now(UTC)
        return AttemptResult(r.id, r.attempts + 1, status, "failed", now, now)

    results = await run_in_order([row(1, "a"), row(2, "a"), row(3, "a", Status.RETRYING)], attempt)
    assert ran == [1, 2]
    deferred = results[2]
    assert (deferred.id, deferred.deferred, deferred.status) == (3, True, Status.RETRYING)
    assert (deferred.attempt, deferred.delay_seconds, deferred.error) == (3, 0.0, BEHIND)


def test_stopped_holds_a_key_after_a_failure_or_a_message_that_did_not_run() -> None:
    stopped = Stopped([row(9, "abandoned")])
    assert stopped.holds(row(10, "abandoned"))
    now = datetime.now(UTC)
    stopped.stop(row(1, "a"), AttemptResult(1, 3, Status.PROCESSED, "processed", now, now))
    assert not stopped.holds(row(2, "a"))
    stopped.stop(row(2, "a"))  # not run: its claim was lost
    assert stopped.holds(row(3, "a"))
    stopped.stop(row(4, None))
    assert not stopped.holds(row(5, None))
    assert behind(row(3, "a")).outcome == "deferred"
