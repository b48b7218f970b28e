"""The standard-webhooks kind on its own, handed requests signed by the `standardwebhooks`
library itself."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from service.sources.standard_webhooks import decode_secret, sign
from tests.senders.standard_webhooks import BODY, CONFIG, NEW_SECRET, OLD_SECRET, signed_request
from tests.verdicts import messages_of, refusal_of, source_of

SOURCE = source_of(CONFIG, "sw")


async def test_rotated_secret_still_verifies() -> None:
    verdict = await messages_of(SOURCE, BODY, signed_request(OLD_SECRET, "msg_old", BODY))
    assert [m.message_id for m in verdict.items] == ["msg_old"]


async def test_one_matching_signature_among_several_verifies() -> None:
    headers = signed_request(NEW_SECRET, "msg_multi", BODY)
    headers["webhook-signature"] = "v1,AAAA v1a,ignored " + headers["webhook-signature"]
    verdict = await messages_of(SOURCE, BODY, headers)
    assert [m.message_id for m in verdict.items] == ["msg_multi"]


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda h, b: (h, b + b" "), "no webhook-signature matches"),
        (
            lambda h, b: ({**h, "webhook-signature": h["webhook-signature"][:-4] + "AAA="}, b),
            "no webhook-signature matches",
        ),
        (lambda h, b: ({**h, "webhook-id": "msg_other"}, b), "no webhook-signature matches"),
        (lambda h, b: ({k: v for k, v in h.items() if k != "webhook-id"}, b), "webhook-id"),
        (
            lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b),
            "webhook-signature",
        ),
        (lambda h, b: ({**h, "webhook-timestamp": "soon"}, b), "not an integer"),
        (lambda h, b: ({**h, "webhook-signature": "v2,abc"}, b), "no v1 signature"),
    ],
)
async def test_tampering_is_401(mutate, detail: str) -> None:  # type: ignore[no-untyped-def]
    headers, body = mutate(signed_request(NEW_SECRET, "msg_t", BODY), BODY)
    refusal = await refusal_of(SOURCE, body, headers)
    assert refusal.status == 401
    assert detail in refusal.detail


@pytest.mark.parametrize(("offset", "word"), [(-301, "too old"), (301, "future")])
async def test_timestamps_outside_tolerance_both_ways(offset: int, word: str) -> None:
    at = datetime.now(tz=UTC) + timedelta(seconds=offset)
    refusal = await refusal_of(SOURCE, BODY, signed_request(NEW_SECRET, "msg_s", BODY, at))
    assert refusal.status == 401
    assert word in refusal.detail


async def test_timestamp_inside_tolerance_is_accepted() -> None:
    at = datetime.now(tz=UTC) - timedelta(seconds=280)
    verdict = await messages_of(SOURCE, BODY, signed_request(NEW_SECRET, "msg_ok", BODY, at))
    assert [m.message_id for m in verdict.items] == ["msg_ok"]


async def test_wrong_secret_is_401() -> None:
    other = "whsec_" + base64.b64encode(b"someone-else-entirely-000000000").decode()
    refusal = await refusal_of(SOURCE, BODY, signed_request(other, "msg_w", BODY))
    assert refusal.status == 401


def test_our_signature_matches_the_library_and_the_library_verifies_ours() -> None:
    now = int(time.time())
    ours = sign(decode_secret(NEW_SECRET), "msg_x", now, BODY)
    theirs = Webhook(NEW_SECRET).sign("msg_x", datetime.fromtimestamp(now, tz=UTC), BODY.decode())
    assert ours == theirs
    headers = {"webhook-id": "msg_x", "webhook-timestamp": str(now), "webhook-signature": ours}
    assert Webhook(NEW_SECRET).verify(BODY, headers) == json.loads(BODY)


def test_standard_webhooks_spec_example_vector() -> None:
    # The worked example in the Standard Webhooks specification.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert sign(decode_secret(secret), "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == expected
