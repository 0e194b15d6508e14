"""`python -m services.natsauth` runs the NATS auth callout service."""

from services.natsauth import cli

cli.main()
