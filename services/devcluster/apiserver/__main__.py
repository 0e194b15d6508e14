"""Entry point: `python -m services.devcluster.apiserver`."""

from services.devcluster.apiserver.cli import main

__all__: list[str] = []

main()
