"""How an operator command ends: its exit status, and the one line said on stderr."""

from __future__ import annotations

import sys
from enum import IntEnum
from typing import NoReturn


class Exit(IntEnum):
    """Exit statuses of the operator commands (docs/cli.md#exit-status)."""

    OK = 0
    # The message does not exist, the change is not allowed in its status, or the service
    # refused the delivery.
    FAILED = 1
    # Bad options or values, a configuration error, a source `send` cannot sign for.
    USAGE = 2
    # No database to use (not running, not migrated, migrated by a newer release) or no
    # service answering.
    UNAVAILABLE = 3


class CommandError(Exception):
    """Stops a command with `message` on stderr and `status` as the exit status."""

    def __init__(self, message: str, status: Exit) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def not_migrated(described_url: str) -> CommandError:
    """The end of a command that found the database without the inbox's tables."""
    return CommandError(
        f"database {described_url} has no inbox tables: run `webhook-inbox migrate`",
        Exit.UNAVAILABLE,
    )


def exit_with(error: CommandError, command: str) -> NoReturn:
    """End `webhook-inbox <command>` as `error` says: its one line on stderr, its status."""
    print(f"webhook-inbox {command}: {error.message}", file=sys.stderr)
    sys.exit(error.status)
