"""A delivery's headers as the kinds read them: the first value of a name, as `Headers.get`."""

from __future__ import annotations

import json

import pytest
from cloudevents.core.bindings.http import to_binary_event
from starlette.datastructures import Headers

from service.sources.base import (
    AnySource,
    Messages,
    RawDelivery,
    Rejected,
    first_header,
    raw_header_name,
)
from tests.senders import cloudevents as cloudevents_sender
from tests.senders import dapr as dapr_sender
from tests.senders import eventgrid as eventgrid_sender
from tests.senders import github as github_sender
from tests.senders import shopify as shopify_sender
from tests.senders import slack as slack_sender
from tests.senders import stripe as stripe_sender
from tests.verdicts import raw_delivery, source_of

RAW = [
    (b"content-type", b"application/json"),
    (b"x-id", b""),
    (b"content-type", b"text/plain"),
    (b"x-caf\xe9", b"na\xefve"),
]


@pytest.mark.parametrize(
    "name", ["Content-Type", "x-id", "X-ID", "x-caf\u00e9", "X-CAF\u00c9", "absent"]
)
def test_first_header_reads_what_headers_get_reads(name: str) -> None:
    assert first_header(RAW, raw_header_name(name)) == Headers(raw=RAW).get(name)


def test_the_content_type_is_the_first_one_and_empty_when_absent() -> None:
    delivery = RawDelivery("POST", {}, b"", RAW)
    assert (delivery.content_type, delivery.media_type) == ("application/json",) * 2
    bare = RawDelivery("POST", {}, b"", [])
    assert (bare.content_type, bare.media_type) == ("", "")


def _kinds() -> dict[str, tuple[AnySource, RawDelivery]]:
    """An authentic delivery of each kind that reads a header of its own."""
    stripe_body = stripe_sender.event()
    stripe_headers = stripe_sender.headers(stripe_sender.generate_header(stripe_body))
    binary = to_binary_event(cloudevents_sender.event())
    grid_body = json.dumps([eventgrid_sender.event("k1")])
    grid_headers = {**eventgrid_sender.HEADERS, "x-grid-key": eventgrid_sender.KEY}
    return {
        "github": (
            source_of(github_sender.CONFIG, "gh"),
            raw_delivery(*github_sender.signed({"action": "opened"})),
        ),
        "shopify": (
            source_of(shopify_sender.CONFIG, "shop"),
            raw_delivery(*shopify_sender.signed(shopify_sender.ORDER)),
        ),
        "slack": (
            source_of(slack_sender.CONFIG, "slack"),
            raw_delivery(*slack_sender.signed(slack_sender.callback())),
        ),
        "stripe": (
            source_of(stripe_sender.CONFIG, "payments"),
            raw_delivery(stripe_body, stripe_headers),
        ),
        "dapr": (
            source_of(dapr_sender.CONFIG, "orders"),
            raw_delivery(dapr_sender.envelope(), dapr_sender.HEADERS),
        ),
        "cloudevents": (
            source_of(cloudevents_sender.CONFIG, "ce"),
            raw_delivery(binary.body, binary.headers),
        ),
        "eventgrid": (
            source_of(eventgrid_sender.CONFIG, "grid-key"),
            raw_delivery(grid_body, grid_headers),
        ),
    }


KINDS = _kinds()
# The headers each kind reads: what authenticates the delivery, and what names its message.
REPEATED = {
    "github": [b"x-hub-signature-256", b"x-github-delivery", b"x-github-event"],
    "shopify": [b"x-shopify-hmac-sha256", b"x-shopify-webhook-id", b"x-shopify-topic"],
    "slack": [b"x-slack-signature", b"x-slack-request-timestamp"],
    "stripe": [b"stripe-signature"],
    "dapr": [b"dapr-api-token"],
    "eventgrid": [b"x-grid-key"],
    "cloudevents": [b"ce-id", b"ce-source", b"ce-type"],
}
# Of those, the ones a delivery is refused for when their value is wrong (a signature, a
# token, or a signed timestamp); the others change the message the delivery names.
AUTHENTICATING = {
    b"x-hub-signature-256",
    b"x-shopify-hmac-sha256",
    b"x-slack-signature",
    b"x-slack-request-timestamp",
    b"stripe-signature",
    b"dapr-api-token",
    b"x-grid-key",
}


@pytest.mark.parametrize(
    ("kind", "name"), [(kind, name) for kind, names in REPEATED.items() for name in names]
)
async def test_each_kind_reads_a_repeated_header_at_its_first_value(kind: str, name: bytes) -> None:
    # As Starlette's `Headers.get` reads it: a second value of the same name is never looked
    # at, whatever it holds.
    source, delivery = KINDS[kind]
    body, raw = delivery.body, delivery.raw_headers
    original = await source.authenticate(RawDelivery("POST", {}, body, raw))
    assert isinstance(original, Messages)
    first_kept = [*raw, (name, b"something-else")]
    assert await source.authenticate(RawDelivery("POST", {}, body, first_kept)) == original
    changed = RawDelivery("POST", {}, body, [(name, b"something-else"), *raw])
    if name in AUTHENTICATING:
        with pytest.raises(Rejected):
            await source.authenticate(changed)
    else:
        assert await source.authenticate(changed) != original
