"""Helpers shared by the discovery agent's integration tests: run the agent in-process until
its first slices are published, and poll for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from services.discovery.agent import DiscoveryAgent
from shared.supervisor import run_agent

__all__ = ["eventually", "running"]

T = TypeVar("T")


async def eventually(check: Callable[[], T | None], *, timeout_s: float = 10.0) -> T:
    """Poll `check` until it returns something truthy; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(agent: DiscoveryAgent) -> AsyncIterator[DiscoveryAgent]:
    """The agent, once it has published its slices; it must stop cleanly (exit 0)."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(agent, grace_s=5, stop=stop, handle_signals=False))
    try:
        await asyncio.wait_for(agent.published.wait(), 15)
        yield agent
    finally:
        stop.set()
        code = await asyncio.wait_for(task, 10)
    assert code == 0
