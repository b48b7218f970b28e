"""The sns kind on its own: v1/v2 signatures by a local certificate served through a test-only
fetcher, the certificate host rule, topics, and subscription confirmations refused."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from service.core.settings import ConfigError
from service.sources.base import AnySource
from service.sources.config_file import parse_inbox_config
from service.sources.sns import string_to_sign
from tests.senders.sns import (
    CONFIG,
    HEADERS,
    KEY,
    FakeFetcher,
    confirmation,
    notification,
    signed,
    with_fetcher,
)
from tests.verdicts import messages_of, refusal_of, source_of


@pytest.fixture
def alerts(fetcher: FakeFetcher) -> AnySource:
    return with_fetcher(source_of(CONFIG, "alerts"), fetcher)


def test_string_to_sign_matches_the_documented_layout() -> None:
    message = {
        "Type": "Notification",
        "MessageId": "4d4dc071-ddbf-465d-bba8-08f81c89da64",
        "Subject": "My subject",
        "Message": "My Test Message",
        "Timestamp": "2019-01-31T04:37:04.321Z",
        "TopicArn": "arn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P",
    }
    assert string_to_sign(message) == (
        b"Message\nMy Test Message\nMessageId\n4d4dc071-ddbf-465d-bba8-08f81c89da64\n"
        b"Subject\nMy subject\nTimestamp\n2019-01-31T04:37:04.321Z\n"
        b"TopicArn\narn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P\n"
        b"Type\nNotification\n"
    )
    del message["Subject"]
    assert b"Subject" not in string_to_sign(message)


async def test_event_type_from_a_message_attribute(fetcher: FakeFetcher) -> None:
    manual = with_fetcher(source_of(CONFIG, "manual"), fetcher)
    (message,) = (await messages_of(manual, signed(KEY, notification()), HEADERS)).items
    assert message.event_type == "order.shipped"


async def test_tampered_message_wrong_key_and_wrong_version_are_401(alerts: AnySource) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tampered = json.loads(signed(KEY, notification()))
    tampered["Message"] = "Hello mallory!"
    v1_claimed_as_v2 = json.loads(signed(KEY, notification()))
    v1_claimed_as_v2["SignatureVersion"] = "2"
    bad_signature = json.loads(signed(KEY, notification()))
    bad_signature["Signature"] = "not base64!"
    refusals = [
        await refusal_of(alerts, body, HEADERS)
        for body in (
            json.dumps(tampered).encode(),
            signed(other, notification()),
            json.dumps(v1_claimed_as_v2).encode(),
            json.dumps(bad_signature).encode(),
            signed(KEY, notification(), version="3"),
        )
    ]
    assert [r.status for r in refusals] == [401] * 5


@pytest.mark.parametrize(
    "cert_url",
    [
        "https://evil.example.com/SimpleNotificationService-x.pem",
        "http://sns.us-west-2.amazonaws.com/SimpleNotificationService-x.pem",
        "https://sns.us-west-2.amazonaws.com.evil.example.com/x.pem",
        "https://sns.us-west-2.amazonaws.com/x.txt",
        "https://sns.us-west-2.amazonaws.com:8443/x.pem",
        "https://user@sns.us-west-2.amazonaws.com/x.pem",
    ],
)
async def test_certificate_outside_sns_is_refused_without_a_fetch(
    alerts: AnySource, fetcher: FakeFetcher, cert_url: str
) -> None:
    message = json.loads(signed(KEY, notification()))
    message["SigningCertURL"] = cert_url
    refusal = await refusal_of(alerts, json.dumps(message).encode(), HEADERS)
    assert refusal.status == 401
    assert "SigningCertURL" in refusal.detail
    assert fetcher.certificate_calls == []


async def test_china_region_certificate_host_is_allowed(
    alerts: AnySource, fetcher: FakeFetcher
) -> None:
    url = "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem"
    message = {"SignatureVersion": "2", "SigningCertURL": url, **notification()}
    message["Signature"] = base64.b64encode(
        KEY.sign(string_to_sign(message), padding.PKCS1v15(), hashes.SHA256())
    ).decode()
    verdict = await messages_of(alerts, json.dumps(message).encode(), HEADERS)
    assert [m.message_id for m in verdict.items] == ["22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324"]
    assert fetcher.certificate_calls == [url]


async def test_other_topic_is_403_and_missing_id_is_400(alerts: AnySource) -> None:
    other_topic = {**notification(), "TopicArn": "arn:aws:sns:us-west-2:999999999999:Other"}
    no_id = {k: v for k, v in notification().items() if k != "MessageId"}
    forbidden = await refusal_of(alerts, signed(KEY, other_topic), HEADERS)
    missing = await refusal_of(alerts, json.dumps(no_id).encode(), HEADERS)
    broken = await refusal_of(alerts, b"{", HEADERS)
    assert forbidden.status == 403
    assert missing.status == 400
    assert "MessageId" in missing.detail
    assert broken.status == 400


async def test_confirmation_with_a_foreign_subscribe_url_or_bad_signature_is_refused(
    alerts: AnySource, fetcher: FakeFetcher
) -> None:
    foreign = {**confirmation(), "SubscribeURL": "https://evil.example.com/?Action=Confirm"}
    tampered = json.loads(signed(KEY, confirmation()))
    tampered["SubscribeURL"] = "https://sns.us-west-2.amazonaws.com/?Action=Other"
    other_topic = {**confirmation(), "TopicArn": "arn:aws:sns:us-west-2:999999999999:Other"}
    a = await refusal_of(alerts, signed(KEY, foreign), HEADERS)
    b = await refusal_of(alerts, json.dumps(tampered).encode(), HEADERS)
    c = await refusal_of(alerts, signed(KEY, other_topic), HEADERS)
    assert (a.status, b.status, c.status) == (403, 401, 403)
    assert fetcher.confirm_calls == []


def test_topic_arns_are_required() -> None:
    with pytest.raises(ConfigError, match="topic_arns"):
        parse_inbox_config({"sources": {"s": {"kind": "sns"}}})
