"""`python -m services.health` runs the health agent."""

from services.health import cli

cli.main()
