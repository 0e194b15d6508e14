"""Every dractl command, in the order `dractl --help` lists them."""

from __future__ import annotations

from services.dractl.commands import (
    alerts,
    claims,
    classes,
    completion,
    drain,
    explain,
    fault,
    health,
    inventory,
    undrain,
)
from services.dractl.subcommands import Command

__all__ = ["COMMANDS"]

COMMANDS: tuple[Command, ...] = (
    inventory,
    health,
    claims,
    fault,
    drain,
    undrain,
    alerts,
    explain,
    classes,
    completion,
)
