"""Source kinds: each module verifies one provider's deliveries; this table names them."""

from __future__ import annotations

from service.sources.base import Source
from service.sources.generic import GenericSource
from service.sources.standard_webhooks import StandardWebhooksSource

KINDS: dict[str, type[Source]] = {
    cls.kind: cls
    for cls in (
        GenericSource,
        StandardWebhooksSource,
    )
}

__all__ = ["KINDS", "Source"]
