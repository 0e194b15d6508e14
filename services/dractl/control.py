"""What `fault`, `drain` and `undrain` share: a request to the node's health agent under one
span, and its answer written back.

The span starts the trace that the health and allocation agents continue (the request carries
it); the answer is one line in a table format, else the agent's reply as one document.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace

from services.dractl import document
from services.dractl.output import Output
from shared import telemetry

__all__ = ["request_span", "write_answer"]

tracer = telemetry.tracer(__name__)


@contextlib.contextmanager
def request_span(args: argparse.Namespace, *, action: str) -> Iterator[None]:
    """The span of the `args.command` request about `args.device` of `args.node_name`."""
    attributes = {"node": args.node_name, "device": args.device, "action": action}
    with tracer.start_as_current_span(
        f"dractl.{args.command}", kind=trace.SpanKind.CLIENT, attributes=attributes
    ):
        yield


def write_answer(
    args: argparse.Namespace, answer: dict[str, Any], output: Output, *, action: str, text: str
) -> None:
    """`text` in a table format; else the request and the agent's `answer`, as one document."""
    if output.tabular:
        output.out.write(text + "\n")
        return
    result = {
        "driver": args.driver_name,
        "node": args.node_name,
        "device": args.device,
        "action": action,
        **{k: v for k, v in answer.items() if k not in ("driver", "node", "device", "action")},
    }
    document.dump(result, output=output.format, out=output.out)
