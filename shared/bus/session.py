"""A short-lived NATS session (a dractl command, a dev-cluster flow): connect with a deadline,
then drain."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.errors import BusUnavailableError
from shared.redaction import redact_url

__all__ = ["open_bus"]


@contextlib.asynccontextmanager
async def open_bus(
    settings: NATSSettings,
    *,
    timeout_s: float = 5.0,
    name: str = "dractl",
    component: str = "operator",
    node: str = "",
) -> AsyncIterator[Bus]:
    """A Bus of that identity (an operator's unless told), connected within `timeout_s` or
    `BusUnavailableError`, drained and closed afterwards."""
    bus = Bus(settings, name=name, component=component, node=node)
    connector = asyncio.create_task(bus.run(), name="bus-connector")
    try:
        try:
            await asyncio.wait_for(bus.connected.wait(), timeout_s)
        except TimeoutError as exc:
            raise BusUnavailableError(
                f"cannot reach NATS at {redact_url(settings.url)} within {timeout_s}s"
            ) from exc
        yield bus
    finally:
        await bus.close()
        connector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connector
