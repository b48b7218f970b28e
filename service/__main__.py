"""`python -m service` is the `webhook-inbox` command."""

from service.cli import main

main()
