import hashlib
import hmac
from typing import Any

import pytest

from service.sources.base import Unauthenticated
from service.sources.signing import KeyedHmac, keyed_macs, require_mac_match, require_match


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


def _verdict(check: Any) -> str:
    try:
        check()
    except Unauthenticated as refused:
        return str(refused)
    return "accepted"


@pytest.mark.parametrize("keys", [[b"old"], [b"old", b"new"], [b"new", b"old"]])
@pytest.mark.parametrize(
    "offered",
    [[], [b"x" * 32], ["new"], ["other", "new"], ["new", "other"], ["old", "new"], [b""]],
)
def test_require_mac_match_answers_as_require_match_over_the_digests(
    keys: list[bytes], offered: list[Any]
) -> None:
    # "new" stands for the digest under the key b"new"; bytes are offered as they are.
    content = b"msg_1.1700000000.{}"
    digests = [
        hmac.new(o.encode(), content, hashlib.sha256).digest() if isinstance(o, str) else o
        for o in offered
    ]
    macs = keyed_macs(keys)
    expected = [mac.digest(content) for mac in macs]
    fast = _verdict(lambda: require_mac_match(macs, content, digests, "no match"))
    listed = _verdict(lambda: require_match(expected, digests, "no match"))
    assert fast == listed
    assert fast == (
        "accepted"
        if any(o in ("old", "new") and o.encode() in keys for o in offered if isinstance(o, str))
        else "no match"
    )
