"""Source kinds: each module verifies one provider's deliveries; this table names them."""

from __future__ import annotations

from service.sources.base import AnySource, Source
from service.sources.brokers import BROKER_KINDS
from service.sources.cloudevents import CloudEventsSource
from service.sources.dapr import DaprSource
from service.sources.eventgrid import EventGridSource
from service.sources.generic import GenericSource
from service.sources.github import GitHubSource
from service.sources.pubsub import PubSubSource
from service.sources.shopify import ShopifySource
from service.sources.slack import SlackSource
from service.sources.sns import SnsSource
from service.sources.standard_webhooks import StandardWebhooksSource
from service.sources.stripe import StripeSource

_HTTP_KINDS: tuple[type[AnySource], ...] = (
    GenericSource,
    StandardWebhooksSource,
    StripeSource,
    GitHubSource,
    ShopifySource,
    SlackSource,
    PubSubSource,
    SnsSource,
    EventGridSource,
    CloudEventsSource,
    DaprSource,
)
KINDS: dict[str, type[AnySource]] = {cls.kind: cls for cls in (*_HTTP_KINDS, *BROKER_KINDS)}

__all__ = ["KINDS", "Source"]
