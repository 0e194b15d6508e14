"""dractl command line: the global flags, then the command, one module each
(`registry.COMMANDS`: `inventory`, `health`, `claims`, `fault inject|clear`, `drain`,
`undrain`, `alerts`, `explain`, `classes generate`, `completion`), which adds its own flags and
runs itself.

The only dractl module that reads argv. Global flags go before or after the subcommand
(`dractl inventory -o json`). NATS flags have env twins like the agents' (`--nats-url` <->
`NATS_URL`); `--node-name` defaults to NODE_NAME, else this host's name.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import sys
import typing
from importlib import metadata
from typing import Any, NoReturn

from services.dractl.output import FORMATS
from services.dractl.registry import COMMANDS
from services.dractl.subcommands import Subcommands
from shared import logging
from shared.config import LogSettings, NATSSettings, env_name
from shared.errors import DraSuiteError

__all__ = ["main"]

_DESCRIPTION = (
    "What the dra-suite agents published on NATS (inventory, health, prepared claims, alerts), "
    "and an operator's requests to them (faults, drains). Global flags go before or after the "
    "command; every NATS flag has an env twin (--nats-url <-> NATS_URL)."
)


class _Parser(argparse.ArgumentParser):
    """Usage errors in two lines, as kubectl prints them, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nSee '{self.prog} --help' for usage.\n")


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The flags every subcommand takes too. Below the top level their default is SUPPRESS,
    so a flag given before the subcommand is not reset by the subcommand's parser."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    nats = parser.add_argument_group("NATS (env twins: NATS_URL, ...)")
    hints = typing.get_type_hints(NATSSettings)
    for field in dataclasses.fields(NATSSettings):
        flag = field.metadata["flag"]
        nats.add_argument(
            flag,
            dest=flag.lstrip("-").replace("-", "_"),
            type=_value_type(hints[field.name]),
            default=default(None),
            help=f"{field.metadata['help']} [env {env_name(flag)}]" if top else argparse.SUPPRESS,
        )
    parser.add_argument(
        "--node-name",
        default=default(os.environ.get("NODE_NAME") or socket.gethostname()),
        help="the node asked about [env NODE_NAME; default: this host's name]",
    )
    parser.add_argument(
        "--driver-name",
        default=default(os.environ.get("DRIVER_NAME", "sim.dra-suite.io")),
        help="the DRA driver [env DRIVER_NAME; default sim.dra-suite.io]",
    )
    parser.add_argument(
        "-o", "--output", choices=FORMATS, default=default("table"), help="output format"
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=default(os.environ.get("OTLP_ENDPOINT", "")),
        help="OTLP/gRPC collector for dractl's spans (as the agents'); empty: the SDK's "
        "OTEL_EXPORTER_OTLP_ENDPOINT, else no export",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="log NATS connection events (on stderr)",
    )


def _value_type(annotation: Any) -> Any:
    """How a NATS flag's text becomes its field's value (as the agents' flags do)."""
    if annotation is bool:
        return lambda text: text.strip().lower() in ("1", "true", "yes", "on")
    return annotation if annotation in (int, float) else str


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dractl", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dractl {_version()}")
    _global_flags(parser, top=True)
    below = _Parser(add_help=False)
    _global_flags(below, top=False)
    action = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subcommands = Subcommands(parser, action, global_flags=below)
    for command in COMMANDS:
        command.register(subcommands)
    return parser


def _version() -> str:
    try:
        return metadata.version("dra-suite")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code = _main(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # `dractl ... | head` closed the pipe: the reader has what it wanted, so no traceback
        # and no failure. Python's own advice: point stdout at devnull, so that the flush at
        # exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


def _main(args: argparse.Namespace) -> int:
    # stdout carries only the answer (`dractl -o json ... | jq`); logs go to stderr, and only
    # errors unless asked for.
    # Without --verbose, not even the connection's warnings: an unreachable NATS is one line.
    level = "info" if args.verbose else "error"
    logging.configure(LogSettings(level=level, format="console"), service="dractl")
    command = {c.NAME: c for c in COMMANDS}[args.command]
    try:
        return asyncio.run(command.run(args, out=sys.stdout, err=sys.stderr))
    except DraSuiteError as exc:
        print(f"dractl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
