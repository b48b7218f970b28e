"""What Amazon SNS sends: notifications and subscription messages signed (v1 or v2) by a local
certificate, which a test-only fetcher serves to the source in place of AWS."""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from service.sources.sns import SnsSource, string_to_sign

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


# The key of the certificate the fetcher serves.
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


class FakeFetcher:
    """Serves one local certificate (of `KEY` unless told) for any URL and records
    every call."""

    def __init__(self, pem: bytes | None = None) -> None:
        self.pem = pem or self_signed(KEY)
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


def with_fetcher(source: Any, fetcher: FakeFetcher) -> SnsSource:
    """`source`, fetching from `fetcher`: the test-only resolver; the host rule stays in force."""
    assert isinstance(source, SnsSource)
    source.fetcher = fetcher
    return source


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
