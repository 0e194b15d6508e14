"""dractl command line: `inventory`, `health`, `fault inject|clear`, `drain`, `undrain`, `alerts`.

The only dractl module that reads argv and the environment. NATS flags have env twins like
the agents' (`--nats-url` <-> `NATS_URL`); `--node-name` defaults to this host's name.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

from services.dractl import queries, render
from services.dractl.session import open_bus
from shared import logging
from shared.bus.connection import Bus
from shared.config import LogSettings, NATSSettings, add_arguments, from_args
from shared.errors import DraSuiteError
from shared.pb.drasuite.v1 import health_pb2

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dractl", description=__doc__)
    add_arguments(parser, NATSSettings)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", socket.gethostname()))
    parser.add_argument("--driver-name", default=os.environ.get("DRIVER_NAME", "sim.dra-suite.io"))
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log NATS connection events (on stderr)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("inventory", help="devices the discovery agent published")
    commands.add_parser("health", help="health of every device, as the health agent recorded it")
    fault = commands.add_parser("fault", help="inject or clear a fault on a sim device")
    fault.add_argument("action", choices=("inject", "clear"))
    fault.add_argument("device")
    fault.add_argument("--cause", default="injected")
    fault.add_argument("--code", default="")
    fault.add_argument("--message", default="")
    drain = commands.add_parser("drain", help="taint a device by hand (<driver>/drain)")
    drain.add_argument("device")
    drain.add_argument("--reason", default="manual drain", help="kept on the DeviceTaintRule")
    undrain = commands.add_parser("undrain", help="remove a device's manual drain taint")
    undrain.add_argument("device")
    alerts = commands.add_parser("alerts", help="ops alerts from the alert stream")
    alerts.add_argument("--follow", "-f", action="store_true")
    alerts.add_argument("--last", type=int, default=20)
    return parser


async def _drain(bus: Bus, args: argparse.Namespace, ids: dict[str, str]) -> None:
    drain = args.command == "drain"
    reason = getattr(args, "reason", "")
    await queries.drain(bus, device=args.device, drain=drain, reason=reason, **ids)
    print(f"{args.node_name}/{args.device} {args.command}ed")


async def _run(args: argparse.Namespace) -> int:
    settings = from_args(NATSSettings, args, os.environ)
    ids = {"driver": args.driver_name, "node": args.node_name}
    async with open_bus(settings) as bus:
        if args.command == "inventory":
            inv = await queries.inventory(bus, **ids)
            if args.output == "json":
                render.json_lines([inv], out=sys.stdout)
            else:
                render.inventory_table(inv, out=sys.stdout)
        elif args.command == "health":
            records = await queries.health(bus, **ids)
            if args.output == "json":
                render.json_lines(records, out=sys.stdout)
            else:
                render.health_table(records, out=sys.stdout)
        elif args.command == "fault":
            command = health_pb2.FaultCommand(
                device=args.device,
                clear=args.action == "clear",
                cause=args.cause,
                code=args.code,
                message=args.message,
            )
            await queries.inject_fault(bus, command=command, **ids)
            print(f"fault {args.action}ed on {args.node_name}/{args.device}")
        elif args.command in ("drain", "undrain"):
            await _drain(bus, args, ids)
        elif args.command == "alerts":
            async for alert in queries.alerts(bus, follow=args.follow, last=args.last):
                if args.output == "json":
                    render.json_lines([alert], out=sys.stdout)
                else:
                    print(render.alert_line(alert), flush=True)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    # stdout carries only the answer (`dractl -o json ... | jq`); logs go to stderr, and only
    # warnings unless asked for.
    level = "info" if args.verbose else "warning"
    logging.configure(LogSettings(level=level, format="console"), service="dractl")
    try:
        code = asyncio.run(_run(args))
    except DraSuiteError as exc:
        print(f"dractl: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
