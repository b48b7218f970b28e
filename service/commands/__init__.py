"""Operator commands of `webhook-inbox`: the inbox from the shell, test deliveries, the DB URL."""
