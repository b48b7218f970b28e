"""What the tail's tests deliver and expect: one message processed, with a redelivery, and one
whose handler fails until it is dead, so that every kind of tail event appears."""

from __future__ import annotations

# (kind, source, message id) of each event, in the order they happen.
EVERY_KIND = [
    ("accepted", "orders", "o-1"),
    ("duplicate", "orders", "o-1"),
    ("processed", "orders", "o-1"),
    ("accepted", "flaky", "f-1"),
    ("failed", "flaky", "f-1"),
    ("dead", "flaky", "f-1"),
]
