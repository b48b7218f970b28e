"""How a command's parser is made, so that every command's help reads the same way."""

from __future__ import annotations

import argparse


def command_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str,
    epilog: str,
) -> argparse.ArgumentParser:
    """A command whose description and epilog are printed as written, their lines kept."""
    return commands.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_status_filter(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    choices: list[str],
    metavar: str,
    help: str,
) -> None:
    """`--status`, given any number of times (a list, empty when not given)."""
    parser.add_argument(
        "--status", action="append", default=[], choices=choices, metavar=metavar, help=help
    )
