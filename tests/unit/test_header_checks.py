"""The checks every delivery's headers pass through: what `check_headers` refuses, byte by
byte, and the header names a source remembers for `stored_headers`."""

from __future__ import annotations

import pytest

from service.sources.base import MAX_REMEMBERED_HEADERS, REDACTED, BadDelivery
from service.sources.config_file import build_source
from service.sources.limits import HeadersTooLarge, check_headers

# RFC 9110 §5.1 (a name is a token) and §5.5 (a value has no control character but tab).
TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@pytest.mark.parametrize("byte", range(256))
def test_a_name_byte_passes_only_when_it_is_a_token_character(byte: int) -> None:
    name = b"x-" + bytes([byte]) + b"-y"
    if byte in TOKEN:
        check_headers([(b"host", b"example.com"), (name, b"v")])
    else:
        with pytest.raises(BadDelivery, match="is not an HTTP token"):
            check_headers([(b"host", b"example.com"), (name, b"v")])


@pytest.mark.parametrize("byte", range(256))
def test_a_value_byte_passes_unless_it_is_a_control_character_other_than_tab(byte: int) -> None:
    value = b"a" + bytes([byte]) + b"z"
    if byte == 0x09 or (byte >= 0x20 and byte != 0x7F):
        check_headers([(b"x-note", value), (b"host", b"example.com")])
    else:
        with pytest.raises(BadDelivery, match="x-note contains control characters"):
            check_headers([(b"x-note", value), (b"host", b"example.com")])


def test_no_headers_pass_and_an_empty_name_or_a_large_header_is_named() -> None:
    check_headers([])
    with pytest.raises(BadDelivery, match="is not an HTTP token"):
        check_headers([(b"host", b"example.com"), (b"", b"v")])
    with pytest.raises(HeadersTooLarge, match="header x-big is larger than 8192 bytes"):
        check_headers([(b"host", b"example.com"), (b"x-big", b"v" * 8192)])


def test_a_source_remembers_at_most_so_many_header_names_and_stores_the_rest_alike() -> None:
    source = build_source("g", {"kind": "generic", "id_header": "x-message-id"})
    for n in range(MAX_REMEMBERED_HEADERS + 10):
        assert source.stored_headers([(f"x-h{n}".encode(), b"v")]) == {f"x-h{n}": "v"}
    assert len(source._stored_names) == MAX_REMEMBERED_HEADERS
    # Past the limit, a name is still decoded and judged, only not kept.
    past = [(b"x-api-token", b"t0ken"), (b"caf\xe9", b"v")]
    assert source.stored_headers(past) == {"x-api-token": REDACTED, "café": "v"}
    assert b"x-api-token" not in source._stored_names
    # And remembered names are answered as they were the first time.
    assert source.stored_headers([(b"x-h0", b"w"), (b"x-h1", b"x")]) == {"x-h0": "w", "x-h1": "x"}
