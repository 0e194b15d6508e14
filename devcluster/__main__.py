"""`python -m devcluster`: the local stack's command (up, demo, claim, load, ...)."""

from devcluster.cli import main

main()
