"""A sources file with a source of every kind `send` signs for, and of the two it cannot."""

from __future__ import annotations

import tomllib
from typing import Any

SECRET = "send-test-secret-0123456789"
TOKEN = "send-test-token-0123456789"
# Standard Webhooks keys are `whsec_` and base64.
WHSEC = "whsec_c2VuZC10ZXN0LWtleS1tYXRlcmlhbC0wMTIzNDU2Nzg5"
STRIPE_SECRET = "whsec_send_test_0123456789"

# The sources of the kinds that need nothing but a secret: name, kind and secret.
SIGNED = {
    "standard": ("standard-webhooks", WHSEC),
    "stripe": ("stripe", STRIPE_SECRET),
    "github": ("github", SECRET),
    "shopify": ("shopify", SECRET),
    "slack": ("slack", SECRET),
}
SIGNED_TOML = "".join(
    f'\n[sources.{name}]\nkind = "{kind}"\nsecrets = ["{secret}"]\n'
    for name, (kind, secret) in SIGNED.items()
)

SOURCES_TOML = f"""
[sources.generic-hmac]
kind = "generic"
secrets = ["{SECRET}"]
id_json_pointer = "/id"
event_type_json_pointer = "/type"
[sources.generic-hmac.hmac]
header = "X-Signature"
prefix = "sha256="

[sources.generic-header]
kind = "generic"
id_header = "X-Message-Id"
event_type_header = "X-Type"
basic_auth = "user:{SECRET}"
token = "{TOKEN}"

[sources.generic-sha]
kind = "generic"
id_fallback = "body-sha256"
{SIGNED_TOML}
[sources.pubsub]
kind = "pubsub"
token = "{TOKEN}"
event_type_attribute = "eventType"

[sources.eventgrid]
kind = "eventgrid"
key_header = "X-Key"
secrets = ["{SECRET}"]

[sources.cloudevents]
kind = "cloudevents"
secrets = ["{SECRET}"]
[sources.cloudevents.hmac]
header = "X-Signature"

[sources.dapr]
kind = "dapr"
app_api_token = "{TOKEN}"

[sources.sns]
kind = "sns"
topic_arns = ["arn:aws:sns:us-east-1:123456789012:orders"]

[sources.pubsub-oidc]
kind = "pubsub"
audience = "https://inbox.example.com/webhooks/pubsub-oidc"
"""

# Every source send can sign for, and the event type the inbox should record for `--event-type`.
SENDABLE = {
    "generic-hmac": "order.created",
    "generic-header": "order.created",
    "standard": "invoice.paid",
    "stripe": "charge.succeeded",
    "github": "issues.opened",
    "shopify": "orders/create",
    "slack": "app_mention",
    "pubsub": "order.created",
    "eventgrid": "Contoso.Items.ItemReceived",
    "cloudevents": "com.example.order.created",
    "dapr": "com.example.order.created",
}
UNSENDABLE = {"sns": "only AWS", "pubsub-oidc": "only Google"}


def sources_config() -> dict[str, Any]:
    return tomllib.loads(SOURCES_TOML)
