"""`dractl drain DEVICE`: a device tainted by hand (`<driver>/drain`), through the node's
health agent; `undrain` removes the taint."""

from __future__ import annotations

import argparse
from typing import TextIO

from services.dractl import control, queries
from services.dractl.bus_session import bus_session
from services.dractl.output import Output
from services.dractl.subcommands import Subcommands

__all__ = ["NAME", "register", "run"]

NAME = "drain"


def register(subcommands: Subcommands) -> None:
    text = "taint a device by hand (<driver>/drain)"
    parser = subcommands.add(NAME, summary=text, description=text)
    parser.add_argument("device")
    parser.add_argument("--reason", default="manual drain", help="kept on the DeviceTaintRule")


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    output = Output.of(args.output, out=out, err=err)
    node = args.node_name
    async with bus_session(args) as bus:
        with control.request_span(args, action=NAME):
            answer = await queries.drain(
                bus,
                driver=args.driver_name,
                node=node,
                device=args.device,
                drain=True,
                reason=args.reason,
            )
            text = f"{node}/{args.device} drained"
            control.write_answer(args, answer, output, action=NAME, text=text)
    return 0
