"""The one supervisor of every agent: signals, a TaskGroup of named tasks, ordered shutdown.

Agents implement `Agent`: `open()` acquires resources and registers their closers on the exit
stack; `spawn()` starts eternal, named tasks. A task that returns is a bug; a task that fails
stops the others and the process exits 1 so that Kubernetes restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any, Protocol

import structlog

from shared.errors import ConfigError, ProgrammingError

__all__ = ["Agent", "ShutdownRequestedError", "eternal", "run_agent"]

log = structlog.get_logger(__name__)


class ShutdownRequestedError(Exception):
    """Raised inside the TaskGroup when SIGTERM/SIGINT (or `stop`) arrives."""


class Agent(Protocol):
    ready: asyncio.Event

    async def open(self, resources: contextlib.AsyncExitStack) -> None: ...

    def spawn(self, tg: asyncio.TaskGroup) -> None: ...


async def eternal(name: str, coro: Coroutine[Any, Any, Any]) -> None:
    """Await a coroutine that must never return; returning is reported as a bug."""
    await coro
    raise ProgrammingError(f"task {name} returned; eternal tasks must run until cancelled")


async def _raise_when_set(stop: asyncio.Event) -> None:
    await stop.wait()
    raise ShutdownRequestedError


async def run_agent(
    agent: Agent,
    *,
    grace_s: float,
    stop: asyncio.Event | None = None,
    handle_signals: bool = True,
) -> int:
    """Run `agent` until a signal or `stop`; returns the process exit code.

    In-process tests run several agents on one loop: they pass `stop` and no signals.
    """
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    exit_code = 0
    resources = contextlib.AsyncExitStack()
    try:
        await agent.open(resources)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_raise_when_set(stop), name="signal-watch")
            agent.spawn(tg)
            agent.ready.set()
    except* ShutdownRequestedError:
        log.info("shutdown_requested")
    except* ConfigError as group:
        log.error("config_invalid", error=str(group.exceptions[0]))
        exit_code = 2
    except* Exception:
        log.exception("agent_failed")
        exit_code = 1
    finally:
        agent.ready.clear()
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        try:
            async with asyncio.timeout(grace_s):
                await resources.aclose()
        except TimeoutError:
            log.error("shutdown_deadline_exceeded", grace_s=grace_s)
            exit_code = exit_code or 1
    log.info("agent_stopped", exit_code=exit_code)
    return exit_code
