"""Flow control's rules (service/core/flow.py), with no database: the admission over every
combination of a bucket and a breaker, the clock's edges (a bucket's refill, a cool-down's
end, a probe's lease), and how outcomes move a breaker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.core.flow import (
    QUEUE_HORIZON_SECONDS,
    SLOT_EARLY_SECONDS,
    SLOT_LATE_SECONDS,
    Breaker,
    BreakerState,
    Bucket,
    Change,
    Gates,
    admit,
    breaker_state,
    give_back,
    parked,
    record,
    slot_holds,
    tokens_now,
)

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
LEASE = 30.0
LIMITED = Gates(per_second=10.0, burst=10.0)
BROKEN = Gates(breaker_failures=3, cooldown_seconds=5.0)
BOTH = Gates(per_second=10.0, burst=10.0, breaker_failures=3, cooldown_seconds=5.0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_no_gate_admits_all_it_is_asked_for() -> None:
    admission, bucket, breaker = admit(Gates(), None, None, T0, 100, LEASE)
    assert (admission.allowed, admission.wait_seconds, bucket, breaker) == (100, 0.0, None, None)


def test_a_bucket_never_used_is_full_and_gives_whole_tokens() -> None:
    admission, bucket, _ = admit(LIMITED, None, None, T0, 100, LEASE)
    assert (admission.allowed, admission.tokens) == (10, 10)
    assert bucket == Bucket(0.0, T0)
    assert admission.wait_seconds == pytest.approx(0.1)  # the next token


def test_an_empty_bucket_admits_nothing_and_says_when_the_next_token_is_due() -> None:
    admission, bucket, _ = admit(LIMITED, Bucket(0.25, T0), None, T0, 5, LEASE)
    assert admission.allowed == 0
    assert admission.wait_seconds == pytest.approx(0.075)
    assert bucket == Bucket(0.25, T0)  # nothing taken


def test_runs_held_back_get_the_next_free_slots_of_the_queue_one_token_apart() -> None:
    # A 10/s destination: 3 tokens now, 10 runs asking; the other 7 queue from the 4th token.
    admission, bucket, _ = admit(LIMITED, Bucket(3.0, T0), None, T0, 10, LEASE, queue=True)
    assert (admission.allowed, admission.slot_seconds, admission.slots) == (
        3,
        pytest.approx(0.1),
        7,
    )
    # The 7th slot: 0.1 + 6 tokens later; the slots' tokens are taken now, the bucket owes 7.
    assert bucket == Bucket(-7.0, T0, at(0.7))
    # A second claim at once: its runs come due after those, not with them.
    second, bucket, _ = admit(LIMITED, bucket, None, T0, 5, LEASE, queue=True)
    assert (second.allowed, second.slot_seconds, second.queued) == (0, pytest.approx(0.8), True)
    assert bucket is not None
    assert bucket.queued_until == at(1.2)
    assert bucket.tokens == pytest.approx(-12.0)
    # At 0.75 s the bucket has repaid 7.5: no token for a run without a slot until 1.3 s.
    late, _, _ = admit(LIMITED, bucket, None, at(0.75), 1, LEASE, queue=True)
    assert (late.allowed, late.slot_seconds) == (0, pytest.approx(0.55))


def test_while_runs_are_queued_a_run_asking_first_gets_no_token() -> None:
    queued = Bucket(0.0, T0, at(2.0))
    # At 0.5 s: 5 tokens (a limit raised since the queue was given out); of 8 runs, 6 ask for
    # the first time and 2 asked before and hold no slot (they were past the horizon).
    admission, bucket, _ = admit(LIMITED, queued, None, at(0.5), 8, LEASE, queue=True, fresh=6)
    assert (admission.allowed, admission.queued) == (2, True)
    assert admission.slot_seconds == pytest.approx(1.6)  # after the last slot given, 2.0 s
    assert bucket is not None
    assert bucket.queued_until == at(2.6)
    # Once the queue has come due, the tokens are anyone's again.
    later, _, _ = admit(LIMITED, queued, None, at(3.0), 8, LEASE, queue=True, fresh=6)
    assert (later.allowed, later.queued) == (8, False)


def test_a_run_whose_slot_has_come_runs_on_its_token_and_the_others_queue_behind() -> None:
    # The bucket owes 7 (slots given up to 0.7 s); at 0.1 s the first slot has come: it runs
    # with no token taken, claimed late or early by a little; the run without one queues.
    owing = Bucket(-7.0, T0, at(0.7))
    admission, bucket, _ = admit(
        LIMITED, owing, None, at(0.1), 2, LEASE, queue=True, fresh=1, slotted=1
    )
    assert (admission.allowed, admission.slotted, admission.tokens) == (1, 1, 0)
    assert (admission.slots, admission.slot_seconds) == (1, pytest.approx(0.7))
    assert bucket == Bucket(-7.0, at(0.1), at(0.8))
    # A source's own claim (no queue) has no slots: it takes whole tokens only.
    own, _, _ = admit(LIMITED, Bucket(0.75, T0), None, T0, 2, LEASE, slotted=2)
    assert own.allowed == 0


def test_a_slot_holds_from_just_before_it_to_a_while_after_it() -> None:
    slow = Gates(per_second=0.1, burst=1.0)  # a window of 10 s
    assert slot_holds(LIMITED, None, T0) is None
    assert slot_holds(LIMITED, at(1.0), T0) is False  # ahead: the run waits for it
    assert slot_holds(LIMITED, at(SLOT_EARLY_SECONDS), T0) is True
    assert slot_holds(LIMITED, at(-SLOT_LATE_SECONDS), T0) is True  # a stalled worker's
    # Missed by more: its token is lost, and the run asks again (else a paused source's
    # queue would all run at once when it resumes).
    assert slot_holds(LIMITED, at(-SLOT_LATE_SECONDS - 0.01), T0) is None
    assert slot_holds(slow, at(-10.0), T0) is True  # a slow limit's: its bucket's window
    assert slot_holds(slow, at(-10.01), T0) is None


def test_the_breaker_caps_the_runs_on_their_slots_and_those_it_holds_keep_them() -> None:
    admission, bucket, breaker = admit(
        BOTH, Bucket(-5.0, T0, at(0.5)), Breaker(failures=1), T0, 4, LEASE, queue=True, slotted=3
    )
    # Two failures left: two of the three slotted runs; the third keeps its slot, and the run
    # without one gets the next.
    assert (admission.allowed, admission.slotted, admission.reserved) == (2, 2, 2)
    assert (admission.tokens, admission.slots) == (0, 1)
    assert bucket == Bucket(-6.0, T0, at(0.6))
    assert breaker is not None
    assert breaker.reserved == 2
    opened = Breaker(failures=3, open_until=at(5.0), opened_at=T0)
    shut, _, _ = admit(BOTH, Bucket(-5.0, T0), opened, T0, 4, LEASE, queue=True, slotted=3)
    assert (shut.allowed, shut.breaker) == (0, BreakerState.OPEN)


def test_a_queue_gives_slots_up_to_its_horizon_and_the_rest_look_again_after_it() -> None:
    slow = Gates(per_second=1.0, burst=1.0)
    admission, bucket, _ = admit(slow, Bucket(0.0, T0), None, T0, 10_000, LEASE, queue=True)
    assert admission.slot_seconds == pytest.approx(1.0)
    assert bucket is not None
    assert bucket.queued_until == at(QUEUE_HORIZON_SECONDS)  # slots 1 s apart, 1 s to 600 s
    assert (admission.slots, bucket.tokens) == (600, -600.0)
    assert parked(599.0, 7) == 599.0
    assert parked(601.0, 7) == QUEUE_HORIZON_SECONDS + 7
    assert parked(9_999.0, 1_207) == QUEUE_HORIZON_SECONDS + 7


def test_a_claim_that_queues_nothing_keeps_the_queue() -> None:
    queued = Bucket(5.0, T0, at(2.0))
    _, bucket, _ = admit(LIMITED, queued, None, T0, 100, LEASE)  # a source's own claim
    assert bucket is not None
    assert bucket.queued_until == at(2.0)


@pytest.mark.parametrize(
    ("idle", "tokens"), [(0.0, 0.0), (0.05, 0.5), (0.1, 1.0), (0.35, 3.5), (60.0, 10.0)]
)
def test_a_bucket_refills_at_its_rate_up_to_its_burst(idle: float, tokens: float) -> None:
    assert tokens_now(LIMITED, Bucket(0.0, T0), at(idle)) == pytest.approx(tokens)


def test_tokens_a_claim_did_not_use_go_back_up_to_the_burst() -> None:
    assert give_back(LIMITED, Bucket(2.0, T0), 3) == Bucket(5.0, T0)
    assert give_back(LIMITED, Bucket(9.0, T0), 3) == Bucket(10.0, T0)
    assert give_back(LIMITED, Bucket(2.0, T0), -1) == Bucket(2.0, T0)


def test_a_closed_breaker_admits_the_failures_left_less_what_others_hold() -> None:
    admission, _, breaker = admit(BROKEN, None, Breaker(failures=1), T0, 100, LEASE)
    assert (admission.allowed, admission.reserved, admission.breaker) == (
        2,
        2,
        BreakerState.CLOSED,
    )
    assert breaker is not None
    assert breaker.reserved_until == at(LEASE)
    # Another process asks while this claim's reservation is live: nothing left for it.
    again, _, _ = admit(BROKEN, None, breaker, at(1), 100, LEASE)
    assert (again.allowed, again.wait_seconds) == (0, 0.2)
    # Once the reservation's lease has run out, it no longer holds them.
    late, _, _ = admit(BROKEN, None, breaker, at(LEASE + 1), 100, LEASE)
    assert late.allowed == 2


def test_an_open_breaker_admits_nothing_until_its_cooldown_ends_and_takes_no_token() -> None:
    opened = Breaker(failures=3, open_until=at(5), opened_at=T0)
    admission, bucket, _ = admit(BOTH, Bucket(10.0, T0), opened, at(1), 100, LEASE)
    assert (admission.allowed, admission.wait_seconds) == (0, 4.0)
    assert admission.breaker is BreakerState.OPEN
    assert bucket == Bucket(10.0, T0)


def test_at_the_cooldowns_end_one_probe_at_a_time_across_processes() -> None:
    opened = Breaker(failures=3, open_until=at(5), opened_at=T0)
    assert breaker_state(opened, at(4.999)) is BreakerState.OPEN
    assert breaker_state(opened, at(5)) is BreakerState.HALF_OPEN
    first, _, probing = admit(BROKEN, None, opened, at(5), 100, LEASE)
    assert (first.allowed, first.probe, first.reserved) == (1, True, 0)
    assert probing is not None
    assert probing.probing_until == at(5 + LEASE)
    second, _, _ = admit(BROKEN, None, probing, at(6), 100, LEASE)
    assert (second.allowed, second.probe, second.wait_seconds) == (0, False, 1.0)
    # A probe whose process died: its lease ends and another may probe.
    third, _, _ = admit(BROKEN, None, probing, at(5 + LEASE + 0.1), 100, LEASE)
    assert (third.allowed, third.probe) == (1, True)


def test_a_probe_waits_for_a_token_too() -> None:
    opened = Breaker(failures=3, open_until=T0, opened_at=T0)
    admission, _, breaker = admit(BOTH, Bucket(0.5, T0), opened, T0, 100, LEASE)
    assert admission.allowed == 0
    assert breaker is not None
    assert breaker.probing_until is None


def test_with_both_the_breaker_caps_what_the_bucket_grants() -> None:
    admission, bucket, breaker = admit(BOTH, None, Breaker(failures=2), T0, 100, LEASE)
    assert (admission.allowed, admission.tokens, admission.reserved) == (1, 1, 1)
    assert bucket == Bucket(9.0, T0)
    assert breaker is not None
    assert breaker.reserved == 1


def test_failures_in_a_row_open_the_breaker_and_a_success_resets_them() -> None:
    reserved = Breaker(failures=1, reserved=2, reserved_until=at(LEASE))
    after, change = record(
        BROKEN, reserved, T0, failed=1, succeeded=1, error="HTTP 503", released=2, probe=False
    )
    assert (after.failures, after.reserved, after.open_until, change) == (0, 0, None, None)
    opened, change = record(
        BROKEN, reserved, T0, failed=2, succeeded=0, error="HTTP 503", released=2, probe=False
    )
    assert change is Change.OPENED
    assert (opened.failures, opened.open_until, opened.opened_at) == (3, at(5), T0)
    assert opened.last_error == "HTTP 503"


def test_a_probe_reopens_or_closes_the_breaker() -> None:
    probing = Breaker(failures=3, open_until=T0, opened_at=at(-5), probing_until=at(LEASE))
    reopened, change = record(
        BROKEN, probing, at(1), failed=1, succeeded=0, error="timeout", released=0, probe=True
    )
    assert change is Change.REOPENED
    assert (reopened.open_until, reopened.probing_until, reopened.opened_at) == (
        at(6),
        None,
        at(-5),
    )
    closed, change = record(
        BROKEN, probing, at(1), failed=0, succeeded=1, error=None, released=0, probe=True
    )
    assert change is Change.CLOSED
    assert (closed.failures, closed.open_until, closed.probing_until) == (0, None, None)


def test_an_unused_probe_is_released_and_the_breaker_left_as_it_was() -> None:
    probing = Breaker(failures=3, open_until=T0, opened_at=at(-5), probing_until=at(LEASE))
    after, change = record(
        BROKEN, probing, at(1), failed=0, succeeded=0, error=None, released=0, probe=True
    )
    assert change is None
    assert (after.open_until, after.probing_until) == (T0, None)
    assert breaker_state(after, at(1)) is BreakerState.HALF_OPEN  # the next claim may probe
