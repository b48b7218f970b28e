"""Broker consumers: `webhook-inbox consume` (and `serve`'s consumer processes) take messages
from RabbitMQ, NATS JetStream and Redis Streams into the inbox, each acknowledged on the broker
only after its row is committed (docs/brokers.md)."""
