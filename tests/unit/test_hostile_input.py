"""Hostile input: arbitrary headers and bodies never crash a verifier nor pass as authentic."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.sources.base import Messages, Rejected, Source, Unauthenticated
from service.sources.config_file import parse_inbox_config
from tests.hostile import (
    SIGNATURE_IN_BODY,
    SIGNED_SOURCES,
    SIGNERS,
    bodies,
    header_names,
    header_values,
)
from tests.verdicts import raw_delivery

SOURCES: dict[str, Source] = dict(parse_inbox_config({"sources": SIGNED_SOURCES}).sources)


@pytest.mark.parametrize("name", sorted(SIGNED_SOURCES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=st.dictionaries(header_names, header_values, max_size=8), body=bodies)
async def test_arbitrary_requests_are_refused_as_unauthenticated(
    name: str, headers: dict[str, str], body: bytes
) -> None:
    with pytest.raises(Rejected) as info:
        await SOURCES[name].authenticate(raw_delivery(body, headers))
    if name not in SIGNATURE_IN_BODY:
        assert isinstance(info.value, Unauthenticated), info.value.detail


@pytest.mark.parametrize("name", sorted(SIGNERS))
@settings(max_examples=100, deadline=None)
@given(
    body=bodies
    | st.dictionaries(st.text(max_size=8), st.text(max_size=8)).map(
        lambda d: json.dumps(d).encode()
    ),
    msg_id=st.text(
        min_size=1, max_size=40, alphabet=st.characters(min_codepoint=33, max_codepoint=126)
    ),
    flip=st.integers(min_value=0, max_value=10_000),
)
async def test_signed_bodies_verify_and_any_altered_byte_does_not(
    name: str, body: bytes, msg_id: str, flip: int
) -> None:
    headers = {"content-type": "application/json", **SIGNERS[name](body, msg_id)}
    source = SOURCES[name]
    refusal: Rejected | None = None
    try:
        verdict = await source.authenticate(raw_delivery(body, headers))
    except Rejected as exc:
        refusal = exc
    if refusal is None:
        assert isinstance(verdict, Messages) or name == "slack"
    else:
        # Authentic but unusable (no id, not JSON, wrong media type): never a 401.
        assert not isinstance(refusal, Unauthenticated), refusal.detail

    if body:
        altered = bytearray(body)
        altered[flip % len(body)] ^= 0x01
        with pytest.raises(Unauthenticated):
            await source.authenticate(raw_delivery(bytes(altered), headers))
