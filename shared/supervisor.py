"""The one supervisor of every agent: signals, a TaskGroup of named tasks, ordered shutdown.

Agents implement `Agent`: `open()` acquires resources and registers their closers on the exit
stack; `spawn()` starts eternal, named tasks. A task that returns is a bug; a task that fails
stops the others and the process exits 1 so that Kubernetes restarts it.

A TaskGroup cancels its tasks once. On Python 3.11 a third-party `asyncio.wait_for` (nats-py
has many) can swallow that cancellation, and the task would run on while the group waits for
it forever: the agent would hang on SIGTERM until the kubelet kills it. Once the group is
stopping, a task still running a second later is cancelled again and logged by name.

An agent's process runs `run_process`: its blocking calls run on daemon threads
(`DaemonThreadPool`), so that one stuck in a syscall (a write on a full disk) cannot keep the
stopped process alive until it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import signal
from collections.abc import Coroutine, Generator
from typing import Any, Protocol, TypeVar

import structlog

from shared.daemon_pool import DaemonThreadPool
from shared.errors import ConfigError, ProgrammingError

__all__ = ["Agent", "ShutdownRequestedError", "eternal", "run_agent", "run_process"]

log = structlog.get_logger(__name__)

_T = TypeVar("_T")

# How long a stopping task may take to honour a cancellation before it gets another.
RECANCEL_INTERVAL_S = 1.0
# asyncio's own default for its executor.
_BLOCKING_WORKERS = min(32, (os.cpu_count() or 1) + 4)


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


class _StoppableTaskGroup(asyncio.TaskGroup):
    """A TaskGroup that knows its tasks and notices when one fails, so that it can be stopped
    again when a task ignores the group's one cancellation."""

    def __init__(self) -> None:
        super().__init__()
        self.running: set[asyncio.Task[Any]] = set()
        self.stopping = asyncio.Event()

    def create_task(
        self,
        coro: Generator[Any, None, _T] | Coroutine[Any, Any, _T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[_T]:
        task = super().create_task(coro, name=name, context=context)
        self.running.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        self.running.discard(task)
        if task.cancelled() or task.exception() is not None:
            self.stopping.set()

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> None:
        # Python 3.11: a task failing while __aexit__ waits cancels the parent task and never
        # uncancels it, so the closers that run after the group would see `cancelling()` and
        # abort (nats-py's close runs our error callback, which re-raises a pending stop).
        parent = asyncio.current_task()
        before = parent.cancelling() if parent is not None else 0
        try:
            await super().__aexit__(et, exc, tb)
        except asyncio.CancelledError:
            raise
        except BaseException:
            _uncancel_down_to(parent, before)
            raise


def _uncancel_down_to(task: asyncio.Task[Any] | None, count: int) -> None:
    while task is not None and task.cancelling() > count:
        task.uncancel()


async def _cancel_until_stopped(group: _StoppableTaskGroup) -> None:
    """Once the group stops, cancel again whatever still runs after each interval: their
    first cancellation was lost. A stop request counts: it is the signal watch failing."""
    await group.stopping.wait()
    while True:
        await asyncio.sleep(RECANCEL_INTERVAL_S)
        for task in list(group.running):
            if not task.done():
                log.warning("task_cancelled_again", task=task.get_name())
                task.cancel()


async def _open_unless_stopped(
    agent: Agent, resources: contextlib.AsyncExitStack, *, stop: asyncio.Event, grace_s: float
) -> None:
    """`agent.open()`, given up when a stop request comes first: a SIGTERM during a start
    stuck in a blocking call (recovery writing to a failing disk) must not wait for it."""
    opening = asyncio.ensure_future(agent.open(resources))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({opening, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        opening.cancel()
        raise
    finally:
        stopping.cancel()
    if opening.done():
        opening.result()
        return
    opening.cancel()
    await asyncio.wait({opening}, timeout=grace_s)
    if not opening.done():
        log.error("open_abandoned", grace_s=grace_s)
    raise ShutdownRequestedError


async def run_process(agent: Agent, *, grace_s: float) -> int:
    """`run_agent` as the main coroutine of an agent's process (`asyncio.run` in `cli.main`),
    its blocking calls on daemon threads: a call stuck when the agent stops is abandoned at
    exit, as a kill would abandon it, instead of holding the process."""
    asyncio.get_running_loop().set_default_executor(
        DaemonThreadPool(max_workers=_BLOCKING_WORKERS, thread_name_prefix="blocking")
    )
    return await run_agent(agent, grace_s=grace_s)


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
    recancel: asyncio.Task[None] | None = None
    try:
        await _open_unless_stopped(agent, resources, stop=stop, grace_s=grace_s)
        async with _StoppableTaskGroup() as tg:
            recancel = asyncio.create_task(_cancel_until_stopped(tg), name="recancel")
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
        if recancel is not None:
            recancel.cancel()
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
