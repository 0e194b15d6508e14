"""The NATS session of a bus-backed dractl command: the connection its flags (or their env
twins) describe, with dractl's spans exported while it lasts."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator

from shared import telemetry
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.config import NATSSettings, TelemetrySettings, from_args

__all__ = ["bus_session"]


@contextlib.asynccontextmanager
async def bus_session(args: argparse.Namespace) -> AsyncIterator[Bus]:
    settings = from_args(NATSSettings, args, os.environ)
    telemetry.configure(
        TelemetrySettings(otlp_endpoint=args.otlp_endpoint),
        service="dractl",
        node=args.node_name,
        driver=args.driver_name,
        environ=os.environ,
    )
    try:
        async with open_bus(settings, timeout_s=settings.connect_timeout_s) as bus:
            yield bus
    finally:
        telemetry.shutdown()
