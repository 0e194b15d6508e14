"""What a dractl command is: a module that adds its own parser and runs itself.

A command module defines NAME, `register(subcommands)` and `async run(args, out=, err=)`,
and has one line in `registry.COMMANDS`; nothing else changes to add one. dractl imports every
command module to build its parser, so a command whose run needs heavy imports (`explain`,
`classes`: the allocator, CEL, the Kubernetes client) keeps them in a module of its own
(`explain_command`, `classes_command`) that its run imports when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol, TextIO

__all__ = ["Command", "Subcommands"]


class Command(Protocol):
    """A dractl subcommand (a module)."""

    @property
    def NAME(self) -> str:
        """The word after `dractl`."""
        ...

    def register(self, subcommands: Subcommands) -> None:
        """Add the command's parser, named NAME."""
        ...

    async def run(self, args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
        """The command with its parsed flags: its answer on `out`, messages on `err`; the
        exit code."""
        ...


class Subcommands:
    """dractl's subcommands, to which each command adds its own parser."""

    def __init__(
        self,
        dractl: argparse.ArgumentParser,
        action: argparse._SubParsersAction[Any],
        global_flags: argparse.ArgumentParser,
    ) -> None:
        self.dractl = dractl
        """The whole command line (what `completion` completes)."""
        self._action = action
        self._global_flags = global_flags

    def add(
        self, name: str, *, summary: str, description: str | None, global_flags: bool = True
    ) -> argparse.ArgumentParser:
        """The parser of `name`: `summary` in dractl's help, `description` in its own. With
        `global_flags`, dractl's global flags may also follow the command."""
        parents = [self._global_flags] if global_flags else []
        parser: argparse.ArgumentParser = self._action.add_parser(
            name, help=summary, description=description, parents=parents
        )
        return parser
