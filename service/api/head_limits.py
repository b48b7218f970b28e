"""How much of a request head the HTTP server reads, and for how long (no httptools needed)."""

# Request line plus headers. Providers send a few KiB; more is refused with 431.
MAX_REQUEST_HEAD_BYTES = 64 * 1024
# From a connection's start, or its previous response, until its next head is complete.
# Providers send a head in one write; a client slower than this only holds a socket.
REQUEST_HEAD_TIMEOUT_SECONDS = 10.0
