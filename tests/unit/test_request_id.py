"""The request id: the sender's `X-Request-Id` when it is a sane token, else a new one that no
other request, in this process or in a forked sibling, is given."""

from __future__ import annotations

import re

from service.api.request_id import request_id_of
from tests.forking import in_forked_child


def test_a_sane_sender_id_is_kept_and_an_insane_one_replaced() -> None:
    assert request_id_of([(b"x-request-id", b"req-1.2:3_abc")]) == "req-1.2:3_abc"
    made = request_id_of([(b"x-request-id", b"has space")])
    assert re.fullmatch(r"[0-9a-f]{32}", made)


def test_made_ids_are_128_random_bits_and_do_not_repeat() -> None:
    made = {request_id_of([]) for _ in range(10_000)}
    assert len(made) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in made)


def test_a_forked_child_does_not_make_its_parents_ids() -> None:
    # serve forks its HTTP and processing children from one supervisor: each must draw its own.
    _, text = in_forked_child(lambda: "".join(request_id_of([]) for _ in range(100)))
    child = {text[i : i + 32] for i in range(0, len(text), 32)}
    parent = {request_id_of([]) for _ in range(100)}
    assert len(child) == 100
    assert not child & parent
