"""`sns` kind: v1/v2 signatures by a local certificate served through a test-only fetcher."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from service.app import create_app
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from service.sources.sns import SnsSource, string_to_sign
from tests.conftest import running

TOPIC = "arn:aws:sns:us-west-2:123456789012:MyTopic"
CERT_URL = "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem"
SUBSCRIBE_URL = (
    "https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription"
    f"&TopicArn={TOPIC}&Token=2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d"
)
CONFIG: dict[str, Any] = {
    "sources": {
        "alerts": {"kind": "sns", "topic_arns": [TOPIC], "auto_confirm": True},
        "manual": {"kind": "sns", "topic_arns": [TOPIC], "event_type_attribute": "kind"},
    }
}


class FakeFetcher:
    """Serves one local certificate for any URL and records every call."""

    def __init__(self, pem: bytes) -> None:
        self.pem = pem
        self.certificate_calls: list[str] = []
        self.confirm_calls: list[str] = []

    async def certificate_pem(self, url: str) -> bytes:
        self.certificate_calls.append(url)
        return self.pem

    async def confirm_subscription(self, url: str) -> None:
        self.confirm_calls.append(url)


def self_signed(key: rsa.RSAPrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def fetcher(key: rsa.RSAPrivateKey) -> FakeFetcher:
    return FakeFetcher(self_signed(key))


SnsClient = Callable[[], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def sns_client(database_url: str, data_dir: Path, fetcher: FakeFetcher) -> SnsClient:
    @asynccontextmanager
    async def factory() -> AsyncIterator[httpx.AsyncClient]:
        inbox = parse_inbox_config(CONFIG)
        for source in inbox.sources.values():
            assert isinstance(source, SnsSource)
            source.fetcher = fetcher  # the test-only resolver; the host rule stays in force
        app = create_app(Settings(database_url=database_url, data_dir=data_dir), inbox)
        async with running(app) as client:
            yield client

    return factory


def signed(key: rsa.RSAPrivateKey, message: dict[str, Any], version: str = "1") -> bytes:
    message = {"SignatureVersion": version, "SigningCertURL": CERT_URL, **message}
    digest = hashes.SHA1() if version == "1" else hashes.SHA256()
    signature = key.sign(string_to_sign(message), padding.PKCS1v15(), digest)
    message["Signature"] = base64.b64encode(signature).decode()
    return json.dumps(message).encode()


def notification(message_id: str = "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324") -> dict[str, Any]:
    """AWS's sample notification (docs: HTTP/HTTPS notification JSON format)."""
    return {
        "Type": "Notification",
        "MessageId": message_id,
        "TopicArn": TOPIC,
        "Subject": "My First Message",
        "Message": "Hello world!\nwith a second line",
        "Timestamp": "2012-05-02T00:54:06.655Z",
        "UnsubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe&"
        f"SubscriptionArn={TOPIC}:c9135db0-26c4-47ec-8998-413945fb5a96",
        "MessageAttributes": {"kind": {"Type": "String", "Value": "order.shipped"}},
    }


def confirmation(kind: str = "SubscriptionConfirmation") -> dict[str, Any]:
    return {
        "Type": kind,
        "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
        "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d",
        "TopicArn": TOPIC,
        "Message": f"You have chosen to subscribe to the topic {TOPIC}.\n"
        "To confirm the subscription, visit the SubscribeURL included in this message.",
        "SubscribeURL": SUBSCRIBE_URL,
        "Timestamp": "2012-04-26T20:45:04.751Z",
    }


HEADERS = {"content-type": "text/plain; charset=UTF-8", "x-amz-sns-message-type": "Notification"}


async def rows(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT * FROM inbox_messages ORDER BY id"))


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


@pytest.mark.parametrize("version", ["1", "2"])
async def test_signed_notification_is_accepted_then_duplicate(
    sns_client: SnsClient,
    db: asyncpg.Connection,
    key: rsa.RSAPrivateKey,
    fetcher: FakeFetcher,
    version: str,
) -> None:
    body = signed(key, notification(), version)
    async with sns_client() as client:
        first = await client.post("/webhooks/alerts", content=body, headers=HEADERS)
        again = await client.post("/webhooks/alerts", content=body, headers=HEADERS)
    assert first.status_code == 200, first.text
    assert first.json()["message_id"] == "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324"
    assert again.json()["status"] == "duplicate"
    (row,) = await rows(db)
    assert row["event_type"] == "My First Message"
    assert fetcher.certificate_calls == [CERT_URL]  # cached after the first fetch


async def test_event_type_from_a_message_attribute(
    sns_client: SnsClient, db: asyncpg.Connection, key: rsa.RSAPrivateKey
) -> None:
    async with sns_client() as client:
        response = await client.post(
            "/webhooks/manual", content=signed(key, notification()), headers=HEADERS
        )
    assert response.json()["status"] == "accepted"
    (row,) = await rows(db)
    assert row["event_type"] == "order.shipped"


async def test_tampered_message_wrong_key_and_wrong_version_are_401(
    sns_client: SnsClient, db: asyncpg.Connection, key: rsa.RSAPrivateKey
) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tampered = json.loads(signed(key, notification()))
    tampered["Message"] = "Hello mallory!"
    v1_claimed_as_v2 = json.loads(signed(key, notification()))
    v1_claimed_as_v2["SignatureVersion"] = "2"
    bad_signature = json.loads(signed(key, notification()))
    bad_signature["Signature"] = "not base64!"
    async with sns_client() as client:
        responses = [
            await client.post("/webhooks/alerts", content=body, headers=HEADERS)
            for body in (
                json.dumps(tampered).encode(),
                signed(other, notification()),
                json.dumps(v1_claimed_as_v2).encode(),
                json.dumps(bad_signature).encode(),
                signed(key, notification(), version="3"),
            )
        ]
    assert [r.status_code for r in responses] == [401] * 5
    assert await rows(db) == []


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
    sns_client: SnsClient,
    db: asyncpg.Connection,
    key: rsa.RSAPrivateKey,
    fetcher: FakeFetcher,
    cert_url: str,
) -> None:
    message = json.loads(signed(key, notification()))
    message["SigningCertURL"] = cert_url
    async with sns_client() as client:
        response = await client.post(
            "/webhooks/alerts", content=json.dumps(message).encode(), headers=HEADERS
        )
    assert response.status_code == 401
    assert "SigningCertURL" in response.json()["detail"]
    assert fetcher.certificate_calls == []
    assert await rows(db) == []


async def test_china_region_certificate_host_is_allowed(
    sns_client: SnsClient, db: asyncpg.Connection, key: rsa.RSAPrivateKey, fetcher: FakeFetcher
) -> None:
    url = "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem"
    message = {"SignatureVersion": "2", "SigningCertURL": url, **notification()}
    message["Signature"] = base64.b64encode(
        key.sign(string_to_sign(message), padding.PKCS1v15(), hashes.SHA256())
    ).decode()
    async with sns_client() as client:
        response = await client.post(
            "/webhooks/alerts", content=json.dumps(message).encode(), headers=HEADERS
        )
    assert response.json()["status"] == "accepted"
    assert fetcher.certificate_calls == [url]


async def test_other_topic_is_403_and_missing_id_is_400(
    sns_client: SnsClient, db: asyncpg.Connection, key: rsa.RSAPrivateKey
) -> None:
    other_topic = {**notification(), "TopicArn": "arn:aws:sns:us-west-2:999999999999:Other"}
    no_id = {k: v for k, v in notification().items() if k != "MessageId"}
    async with sns_client() as client:
        forbidden = await client.post(
            "/webhooks/alerts", content=signed(key, other_topic), headers=HEADERS
        )
        missing = await client.post(
            "/webhooks/alerts", content=json.dumps(no_id).encode(), headers=HEADERS
        )
        broken = await client.post("/webhooks/alerts", content=b"{", headers=HEADERS)
    assert forbidden.status_code == 403
    assert missing.status_code == 400
    assert "MessageId" in missing.json()["detail"]
    assert broken.status_code == 400
    assert await rows(db) == []


async def test_subscription_confirmation_is_confirmed_and_not_recorded(
    sns_client: SnsClient, db: asyncpg.Connection, key: rsa.RSAPrivateKey, fetcher: FakeFetcher
) -> None:
    headers = {**HEADERS, "x-amz-sns-message-type": "SubscriptionConfirmation"}
    async with sns_client() as client:
        auto = await client.post(
            "/webhooks/alerts", content=signed(key, confirmation(), "2"), headers=headers
        )
        manual = await client.post(
            "/webhooks/manual", content=signed(key, confirmation(), "2"), headers=headers
        )
    assert auto.status_code == 200
    assert auto.json()["status"] == "confirmed"
    assert manual.json()["status"] == "confirmation_pending"
    assert fetcher.confirm_calls == [SUBSCRIBE_URL]
    assert await rows(db) == []


async def test_confirmation_with_a_foreign_subscribe_url_or_bad_signature_is_refused(
    sns_client: SnsClient, db: asyncpg.Connection, key: rsa.RSAPrivateKey, fetcher: FakeFetcher
) -> None:
    foreign = {**confirmation(), "SubscribeURL": "https://evil.example.com/?Action=Confirm"}
    tampered = json.loads(signed(key, confirmation()))
    tampered["SubscribeURL"] = "https://sns.us-west-2.amazonaws.com/?Action=Other"
    other_topic = {**confirmation(), "TopicArn": "arn:aws:sns:us-west-2:999999999999:Other"}
    async with sns_client() as client:
        a = await client.post("/webhooks/alerts", content=signed(key, foreign), headers=HEADERS)
        b = await client.post(
            "/webhooks/alerts", content=json.dumps(tampered).encode(), headers=HEADERS
        )
        c = await client.post("/webhooks/alerts", content=signed(key, other_topic), headers=HEADERS)
    assert (a.status_code, b.status_code, c.status_code) == (403, 401, 403)
    assert fetcher.confirm_calls == []


async def test_unsubscribe_confirmation_is_verified_and_answered(
    sns_client: SnsClient, db: asyncpg.Connection, key: rsa.RSAPrivateKey
) -> None:
    body = signed(key, confirmation("UnsubscribeConfirmation"))
    async with sns_client() as client:
        response = await client.post("/webhooks/alerts", content=body, headers=HEADERS)
    assert response.status_code == 200
    assert response.json()["status"] == "unsubscribed"
    assert await rows(db) == []


def test_topic_arns_are_required() -> None:
    from service.core.settings import ConfigError

    with pytest.raises(ConfigError, match="topic_arns"):
        parse_inbox_config({"sources": {"s": {"kind": "sns"}}})
