"""Running ordering keys' runs: a claim may hold a key's head and the messages behind it
(`store.due.keyed_runs`); they run in id order, and once one of them does not succeed, the
rest of its key's run is deferred (no attempt spent, due at once, held again behind it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from service.core.schema import Status
from service.store.results import DEFERRED, AttemptResult, MessageRow

BEHIND = "an earlier message of its ordering key did not succeed in the same batch"


def key_of(row: MessageRow) -> tuple[str, str] | None:
    return None if row.ordering_key is None else (row.source, row.ordering_key)


def behind(row: MessageRow, at: datetime | None = None) -> AttemptResult:
    """The outcome of a message not run because an earlier one of its key did not succeed:
    back to the status it was claimed in, its attempt given back, due again at once (and held
    behind that one until it finishes)."""
    at = at or datetime.now(UTC)
    return AttemptResult(
        row.id,
        row.attempts + 1,
        row.status,
        DEFERRED,
        at,
        at,
        delay_seconds=0.0,
        error=BEHIND,
        deferred=True,
    )


class Stopped:
    """The keys whose runs stop in a batch: a message of one did not succeed (or was not run),
    so the messages of its key after it must not run."""

    def __init__(self, rows: Iterable[MessageRow] = ()) -> None:
        self._keys = {key for row in rows if (key := key_of(row)) is not None}

    def holds(self, row: MessageRow) -> bool:
        key = key_of(row)
        return key is not None and key in self._keys

    def stop(self, row: MessageRow, result: AttemptResult | None = None) -> None:
        """`row` ran with `result` (None: it did not run): unless it succeeded, stop its key."""
        key = key_of(row)
        if key is not None and (result is None or result.status != Status.PROCESSED):
            self._keys.add(key)


def runs(rows: Iterable[MessageRow]) -> list[list[MessageRow]]:
    """`rows` grouped to run concurrently: each key's messages as one run, in id order; each
    unkeyed message alone."""
    by_key: dict[tuple[str, str], list[MessageRow]] = {}
    groups: list[list[MessageRow]] = []
    for row in sorted(rows, key=lambda r: r.id):
        key = key_of(row)
        if key is None:
            groups.append([row])
        elif key in by_key:
            by_key[key].append(row)
        else:
            by_key[key] = [row]
            groups.append(by_key[key])
    return groups


async def run_in_order(
    run: list[MessageRow], attempt: Callable[[MessageRow], Awaitable[AttemptResult]]
) -> list[AttemptResult]:
    """`attempt` each message of one key's run in turn, until one does not succeed; the rest
    are deferred (`behind`)."""
    results: list[AttemptResult] = []
    stopped = Stopped()
    for row in run:
        if stopped.holds(row):
            results.append(behind(row))
            continue
        result = await attempt(row)
        stopped.stop(row, result)
        results.append(result)
    return results
