import hashlib
import hmac
from typing import Any

import pytest

from service.sources.signing import KeyedHmac


@pytest.mark.parametrize("key_length", [0, 1, 24, 32, 63, 64, 65, 129, 200])
@pytest.mark.parametrize("digest", [hashlib.sha256, hashlib.sha1, hashlib.sha512])
def test_a_keyed_hmac_gives_hmacs_digest_for_every_message(key_length: int, digest: Any) -> None:
    # Keys longer than the digest's block (64 bytes, 128 for SHA-512) are hashed first; the
    # keyed state must agree.
    key = bytes(range(256))[:key_length]
    keyed = KeyedHmac(key, digest) if digest is not hashlib.sha256 else KeyedHmac(key)
    for message in (b"", b"msg_1.1700000000.{}", bytes(range(256)) * 9):
        assert keyed.digest(message) == hmac.new(key, message, digest).digest()


def test_a_keyed_hmac_is_not_changed_by_the_messages_it_signed() -> None:
    keyed = KeyedHmac(b"secret")
    first = keyed.digest(b"one")
    keyed.digest(b"two")
    assert keyed.digest(b"one") == first
