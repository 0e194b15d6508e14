"""A Bus connected for the length of a test block, under any identity."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.config import NATSSettings

__all__ = ["connected"]


@contextlib.asynccontextmanager
async def connected(
    settings: NATSSettings, *, component: str = "", node: str = "", timeout_s: float = 10.0
) -> AsyncIterator[Bus]:
    """A Bus of that identity, connected (or the test fails), closed afterwards."""
    name = f"test-{component or 'client'}"
    async with open_bus(
        settings, timeout_s=timeout_s, name=name, component=component, node=node
    ) as bus:
        yield bus
