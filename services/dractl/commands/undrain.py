"""`dractl undrain DEVICE`: a device's manual drain taint removed, through the node's health
agent."""

from __future__ import annotations

import argparse
from typing import TextIO

from services.dractl import control, queries
from services.dractl.bus_session import bus_session
from services.dractl.output import Output
from services.dractl.subcommands import Subcommands

__all__ = ["NAME", "register", "run"]

NAME = "undrain"


def register(subcommands: Subcommands) -> None:
    text = "remove a device's manual drain taint"
    parser = subcommands.add(NAME, summary=text, description=text)
    parser.add_argument("device")


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    output = Output.of(args.output, out=out, err=err)
    node = args.node_name
    async with bus_session(args) as bus:
        with control.request_span(args, action=NAME):
            answer = await queries.drain(
                bus, driver=args.driver_name, node=node, device=args.device, drain=False
            )
            text = f"{node}/{args.device} undrained"
            control.write_answer(args, answer, output, action=NAME, text=text)
    return 0
