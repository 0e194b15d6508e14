"""`python -m services.allocation` runs the allocation agent."""

from services.allocation import cli

__all__: list[str] = []

cli.main()
