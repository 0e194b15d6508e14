"""A Bus connected for the length of a test block, under any identity."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from shared.bus.connection import Bus
from shared.config import NATSSettings

__all__ = ["connected"]


@contextlib.asynccontextmanager
async def connected(
    settings: NATSSettings, *, component: str = "", node: str = "", timeout_s: float = 10.0
) -> AsyncIterator[Bus]:
    """A Bus of that identity, connected (or the test fails), closed afterwards."""
    bus = Bus(settings, name=f"test-{component or 'client'}", component=component, node=node)
    task = asyncio.create_task(bus.run(), name="bus-connector")
    try:
        await asyncio.wait_for(bus.connected.wait(), timeout_s)
        yield bus
    finally:
        await bus.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
