"""Entry point: `python -m devcluster.apiserver`."""

from devcluster.apiserver.cli import main

__all__: list[str] = []

main()
