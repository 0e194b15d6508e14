"""`dractl fault inject|clear DEVICE`: a fault injected on (or cleared from) a sim device,
through the node's health agent."""

from __future__ import annotations

import argparse
from typing import TextIO

from services.dractl import control, queries
from services.dractl.bus_session import bus_session
from services.dractl.output import Output
from services.dractl.subcommands import Subcommands
from shared.pb.drasuite.v1 import health_pb2

__all__ = ["NAME", "register", "run"]

NAME = "fault"


def register(subcommands: Subcommands) -> None:
    text = "inject or clear a fault on a sim device"
    parser = subcommands.add(NAME, summary=text, description=text)
    parser.add_argument("action", choices=("inject", "clear"))
    parser.add_argument("device")
    parser.add_argument("--cause", default="injected")
    parser.add_argument("--code", default="")
    parser.add_argument("--message", default="")


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    output = Output.of(args.output, out=out, err=err)
    node = args.node_name
    async with bus_session(args) as bus:
        with control.request_span(args, action=args.action):
            command = health_pb2.FaultCommand(
                device=args.device,
                clear=args.action == "clear",
                cause=args.cause,
                code=args.code,
                message=args.message,
            )
            answer = await queries.inject_fault(
                bus, driver=args.driver_name, node=node, command=command
            )
            text = f"fault {args.action}ed on {node}/{args.device}"
            control.write_answer(args, answer, output, action=args.action, text=text)
    return 0
