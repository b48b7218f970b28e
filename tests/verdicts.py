"""A source kind called as the ingest route calls it: a raw delivery in, a verdict or a refusal out.

For the unit tests of the kinds: no app, no database, the same `authenticate` the route awaits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from service.sources.base import AnySource, Messages, RawDelivery, Rejected
from service.sources.config_file import parse_inbox_config


def raw_delivery(
    body: bytes | str,
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
    method: str = "POST",
) -> RawDelivery:
    """A delivery as the route hands it over: header names lower-cased, values Latin-1 bytes."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    data = body.encode() if isinstance(body, str) else body
    return RawDelivery(method, dict(query or {}), data, raw)


def source_of(config: Mapping[str, Any], name: str) -> AnySource:
    """Source `name` of a sources-file document, built and checked as at start-up."""
    return parse_inbox_config(config).sources[name]


async def messages_of(
    source: AnySource,
    body: bytes | str,
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
) -> Messages:
    """The messages an authentic delivery carries (what ingest would record)."""
    verdict = await source.authenticate(raw_delivery(body, headers, query))
    assert isinstance(verdict, Messages), verdict
    return verdict


async def refusal_of(
    source: AnySource,
    body: bytes | str,
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
) -> Rejected:
    """Why the kind refuses a delivery: ingest answers its status and detail, recording nothing."""
    with pytest.raises(Rejected) as refused:
        await source.authenticate(raw_delivery(body, headers, query))
    return refused.value


def assert_refused(refusal: Rejected, status: int, detail_part: str) -> None:
    """A refusal answered with `status` (docs/ingest.md#responses), naming `detail_part`."""
    assert refusal.status == status, refusal.detail
    assert detail_part in refusal.detail, refusal.detail


# A delivery a kind must refuse: what builds it (body and headers), the status it is answered
# and a part of the detail naming its cause.
Rejection = tuple[Callable[[], tuple[bytes | str, Mapping[str, str]]], int, str]


async def assert_rejection(source: AnySource, rejection: Rejection) -> None:
    """The delivery `rejection` builds is refused with its status and a detail naming its cause."""
    build, status, detail_part = rejection
    body, headers = build()
    assert_refused(await refusal_of(source, body, headers), status, detail_part)
