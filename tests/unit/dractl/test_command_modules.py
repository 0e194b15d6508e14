"""Every dractl command is one module that adds its own parser and runs itself, and the
registry lists exactly the commands that `dractl --help` shows."""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys

import pytest

from services.dractl.registry import COMMANDS
from services.dractl.subcommands import Command, Subcommands


def _parsers_added_by(command: Command) -> dict[str, argparse.ArgumentParser]:
    dractl = argparse.ArgumentParser(prog="dractl")
    action = dractl.add_subparsers(dest="command")
    command.register(Subcommands(dractl, action, argparse.ArgumentParser(add_help=False)))
    return dict(action.choices)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.NAME)
def test_a_command_module_defines_its_parser_and_its_run_function(command: Command) -> None:
    assert command.__name__ == f"services.dractl.commands.{command.NAME}"  # type: ignore[attr-defined]
    assert list(_parsers_added_by(command)) == [command.NAME]
    assert inspect.iscoroutinefunction(command.run)
    assert {"args", "out", "err"} <= set(inspect.signature(command.run).parameters)


def _listed_by_help() -> list[str]:
    """The commands under COMMAND in `dractl --help`, in their order."""
    result = subprocess.run(
        [sys.executable, "-m", "services.dractl", "--help"],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    lines = result.stdout.splitlines()
    start = lines.index("  COMMAND") + 1
    listed = []
    for line in lines[start:]:
        if not line.strip():
            break
        if line.startswith("    ") and not line.startswith("     "):
            listed.append(line.split()[0])
    return listed


def test_the_registered_commands_are_those_dractl_help_lists() -> None:
    listed = _listed_by_help()
    assert listed == [command.NAME for command in COMMANDS]
    assert len(set(listed)) == len(listed)
