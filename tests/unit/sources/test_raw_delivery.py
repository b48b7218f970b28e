"""A delivery's headers as the kinds read them: the first value of a name, as `Headers.get`."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from service.sources.base import RawDelivery, first_header

RAW = [
    (b"content-type", b"application/json"),
    (b"x-id", b""),
    (b"content-type", b"text/plain"),
    (b"x-caf\xe9", b"na\xefve"),
]


@pytest.mark.parametrize("name", ["content-type", "x-id", "x-caf\u00e9", "absent"])
def test_first_header_reads_what_headers_get_reads(name: str) -> None:
    assert first_header(RAW, name.encode("latin-1")) == Headers(raw=RAW).get(name)


def test_the_content_type_is_the_first_one_and_empty_when_absent() -> None:
    delivery = RawDelivery("POST", Headers(raw=RAW), {}, b"", RAW)
    assert (delivery.content_type, delivery.media_type) == ("application/json",) * 2
    bare = RawDelivery("POST", Headers(raw=[]), {}, b"", [])
    assert (bare.content_type, bare.media_type) == ("", "")
