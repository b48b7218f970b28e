import hashlib
import hmac

import pytest

from service.sources.signing import KeyedHmacSha256


@pytest.mark.parametrize("key_length", [0, 1, 24, 32, 63, 64, 65, 200])
def test_a_keyed_hmac_gives_hmacs_digest_for_every_message(key_length: int) -> None:
    # Keys longer than SHA-256's 64-byte block are hashed first; the keyed state must agree.
    key = bytes(range(256))[:key_length]
    keyed = KeyedHmacSha256(key)
    for message in (b"", b"msg_1.1700000000.{}", bytes(range(256)) * 9):
        assert keyed.digest(message) == hmac.new(key, message, hashlib.sha256).digest()


def test_a_keyed_hmac_is_not_changed_by_the_messages_it_signed() -> None:
    keyed = KeyedHmacSha256(b"secret")
    first = keyed.digest(b"one")
    keyed.digest(b"two")
    assert keyed.digest(b"one") == first
