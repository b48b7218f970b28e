"""The standard-webhooks kind on its own, handed requests signed by the `standardwebhooks`
library itself."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from standardwebhooks.webhooks import Webhook

from service.core.settings import ConfigError
from service.sources import signing, standard_webhooks
from service.sources.base import Messages, RawDelivery, Unauthenticated
from service.sources.config_file import parse_inbox_config
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


def as_svix(headers: dict[str, str]) -> dict[str, str]:
    return {k.replace("webhook-", "svix-"): v for k, v in headers.items()}


async def test_svix_header_names_verify() -> None:
    headers = as_svix(signed_request(NEW_SECRET, "msg_svix", BODY))
    verdict = await messages_of(SOURCE, BODY, headers)
    assert [m.message_id for m in verdict.items] == ["msg_svix"]


async def test_webhook_headers_win_over_svix_ones_and_an_empty_one_falls_back() -> None:
    ours = signed_request(NEW_SECRET, "msg_ours", BODY)
    theirs = as_svix(signed_request(NEW_SECRET, "msg_theirs", BODY))
    verdict = await messages_of(SOURCE, BODY, {**theirs, **ours})
    assert [m.message_id for m in verdict.items] == ["msg_ours"]
    # Each header falls back on its own: an empty webhook-id reads svix-id, the rest stay ours.
    verdict = await messages_of(SOURCE, BODY, {**ours, "webhook-id": "", "svix-id": "msg_ours"})
    assert [m.message_id for m in verdict.items] == ["msg_ours"]
    refusal = await refusal_of(SOURCE, BODY, {**theirs, "webhook-id": "msg_ours"})
    assert "no webhook-signature matches" in refusal.detail


async def test_a_repeated_header_is_read_at_its_first_value() -> None:
    headers = signed_request(NEW_SECRET, "msg_first", BODY)
    good = headers["webhook-signature"].encode()
    raw = [(k.encode(), v.encode()) for k, v in headers.items() if k != "webhook-signature"]
    first_good = [*raw, (b"webhook-signature", good), (b"webhook-signature", b"v1,AAAA")]
    first_bad = [*raw, (b"webhook-signature", b"v1,AAAA"), (b"webhook-signature", good)]
    verdict = await SOURCE.authenticate(RawDelivery("POST", {}, BODY, first_good))
    assert isinstance(verdict, Messages)
    with pytest.raises(Unauthenticated):
        await SOURCE.authenticate(RawDelivery("POST", {}, BODY, first_bad))


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


# Ten seconds past the 300 s tolerance: a loaded machine may take a second between signing
# and verifying, and the signed timestamp is whole seconds.
@pytest.mark.parametrize(("offset", "word"), [(-310, "too old"), (310, "future")])
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


# v1a: ed25519. The reference libraries' signing vector (standard-webhooks, libraries/go,
# TestAsymmetricWebhookSign): this private seed signs this message as `V1A_EXPECTED`.
V1A_SEED = base64.b64decode("VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=")
V1A_MSG_ID, V1A_TIMESTAMP = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330
V1A_BODY = b'{"test": 2432232314}'
V1A_EXPECTED = (
    "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag=="
)


def public_key_of(seed: bytes) -> str:
    raw = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return "whpk_" + base64.b64encode(raw).decode()


def v1a_request(signature: str, msg_id: str = V1A_MSG_ID) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(V1A_TIMESTAMP),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


@pytest.fixture
def at_the_vector_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signing, "now", lambda: float(V1A_TIMESTAMP + 10))


def test_the_v1a_vector_is_an_ed25519_signature_of_id_timestamp_body() -> None:
    signature = Ed25519PrivateKey.from_private_bytes(V1A_SEED).sign(
        f"{V1A_MSG_ID}.{V1A_TIMESTAMP}.".encode() + V1A_BODY
    )
    assert "v1a," + base64.b64encode(signature).decode() == V1A_EXPECTED


@pytest.mark.usefixtures("at_the_vector_time")
async def test_v1a_vector_verifies_with_the_whpk_public_key() -> None:
    config = {"kind": "standard-webhooks", "public_keys": [public_key_of(V1A_SEED)]}
    source = source_of({"sources": {"pk": config}}, "pk")
    verdict = await messages_of(source, V1A_BODY, v1a_request(V1A_EXPECTED))
    assert [m.message_id for m in verdict.items] == [V1A_MSG_ID]
    for tampered, detail in [
        (v1a_request(V1A_EXPECTED, msg_id="msg_other"), "no webhook-signature matches"),
        (v1a_request("v1a,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="), "matches"),
        (v1a_request("v1a,"), "matches"),
        # A v1 signature means nothing to a source with no secret: it has no v1a entry.
        (v1a_request("v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="), "no v1a signature"),
    ]:
        refusal = await refusal_of(source, V1A_BODY, tampered)
        assert refusal.status == 401
        assert detail in refusal.detail


@pytest.mark.usefixtures("at_the_vector_time")
async def test_v1_and_v1a_in_one_header_either_verifies_as_the_spec_says() -> None:
    other_key = public_key_of(b"\x07" * 32)
    config = {
        "kind": "standard-webhooks",
        "secrets": [NEW_SECRET],
        "public_keys": [other_key, public_key_of(V1A_SEED)],  # rotation: any verifies
    }
    source = source_of({"sources": {"both": config}}, "both")
    v1 = sign(decode_secret(NEW_SECRET), V1A_MSG_ID, V1A_TIMESTAMP, V1A_BODY)
    wrong_v1 = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
    wrong_v1a = "v1a," + base64.b64encode(b"\x00" * 64).decode()
    for header in [
        f"{wrong_v1} v2,abc {V1A_EXPECTED}",  # the v1a one verifies
        f"{wrong_v1a} {v1}",  # the v1 one verifies
        f"{v1} {V1A_EXPECTED}",
    ]:
        verdict = await messages_of(source, V1A_BODY, v1a_request(header))
        assert [m.message_id for m in verdict.items] == [V1A_MSG_ID]
    refusal = await refusal_of(source, V1A_BODY, v1a_request(f"{wrong_v1} {wrong_v1a}"))
    assert refusal.status == 401
    refusal = await refusal_of(source, V1A_BODY, v1a_request("v2,abc"))
    assert "no v1 or v1a signature" in refusal.detail


@pytest.mark.usefixtures("at_the_vector_time")
async def test_only_the_first_v1a_signatures_are_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"kind": "standard-webhooks", "public_keys": [public_key_of(V1A_SEED)]}
    source = source_of({"sources": {"pk": config}}, "pk")
    verified = []
    real = standard_webhooks._ed25519_verifies
    monkeypatch.setattr(
        standard_webhooks,
        "_ed25519_verifies",
        lambda *args: verified.append(1) or real(*args),
    )
    wrong = "v1a," + base64.b64encode(b"\x01" * 64).decode()
    flood = " ".join([wrong] * 500 + [V1A_EXPECTED])
    refusal = await refusal_of(source, V1A_BODY, v1a_request(flood))
    assert refusal.status == 401
    assert len(verified) == standard_webhooks.MAX_V1A_SIGNATURES
    first = " ".join([wrong] * (standard_webhooks.MAX_V1A_SIGNATURES - 1) + [V1A_EXPECTED])
    assert (await messages_of(source, V1A_BODY, v1a_request(first))).items


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("whpk_not-base64!", "public key is not whpk_"),
        ("whpk_" + base64.b64encode(b"short").decode(), "32-byte ed25519 key"),
        ("env:NO_SUCH_WHPK_VARIABLE", "NO_SUCH_WHPK_VARIABLE is not set"),
    ],
)
def test_a_bad_public_key_is_refused_at_start(key: str, message: str) -> None:
    config = {"sources": {"pk": {"kind": "standard-webhooks", "public_keys": [key]}}}
    with pytest.raises(ConfigError, match=message) as caught:
        parse_inbox_config(config)
    assert "sources.pk.public_keys[0]" in str(caught.value)


def test_a_source_needs_a_secret_or_a_public_key() -> None:
    with pytest.raises(ConfigError, match="or public key"):
        parse_inbox_config({"sources": {"sw": {"kind": "standard-webhooks"}}})
