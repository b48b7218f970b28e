"""Processing accepted messages: the handler API, handler resolution, retry policy, forwarding."""
