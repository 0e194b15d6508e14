"""run_agent: exit codes, ordered shutdown, and tasks that lose their cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from structlog.testing import capture_logs

from shared.errors import ConfigError
from shared.supervisor import eternal, run_agent


class FakeAgent:
    """An agent whose tasks are given coroutine factories; it records what happened."""

    def __init__(self, **tasks: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.ready = asyncio.Event()
        self.tasks = tasks
        self.events: list[str] = []

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        self.events.append("open")
        resources.callback(self.events.append, "closed")

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        for name, factory in self.tasks.items():
            tg.create_task(eternal(name, factory()), name=name)


async def _forever() -> None:
    await asyncio.Event().wait()


async def _fails() -> None:
    await asyncio.sleep(0.01)
    raise RuntimeError("boom")


async def _swallows_cancellations(times: int, record: list[str]) -> None:
    """What a wait_for that completes together with its cancellation looks like on 3.11."""
    swallowed = 0
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if swallowed == times:
                record.append("stopped")
                raise
            swallowed += 1
            record.append("swallowed")


async def _run_until_ready(agent: FakeAgent, stop: asyncio.Event) -> asyncio.Task[int]:
    task = asyncio.create_task(run_agent(agent, grace_s=2, stop=stop, handle_signals=False))
    async with asyncio.timeout(5):
        await agent.ready.wait()
    return task


async def test_a_stop_request_closes_resources_and_exits_0() -> None:
    agent = FakeAgent(worker=_forever)
    stop = asyncio.Event()
    task = await _run_until_ready(agent, stop)
    stop.set()
    assert await asyncio.wait_for(task, 5) == 0
    assert agent.events == ["open", "closed"]
    assert not agent.ready.is_set()


async def test_a_task_that_fails_stops_the_agent_with_exit_1() -> None:
    agent = FakeAgent(worker=_forever, failing=_fails)
    assert await asyncio.wait_for(run_agent(agent, grace_s=2, handle_signals=False), 5) == 1
    assert agent.events == ["open", "closed"]


async def test_a_task_that_returns_is_a_bug_and_exits_1() -> None:
    async def returns() -> None:
        await asyncio.sleep(0.01)

    agent = FakeAgent(worker=_forever, returning=returns)
    with capture_logs() as logs:
        assert await asyncio.wait_for(run_agent(agent, grace_s=2, handle_signals=False), 5) == 1
    assert any(entry["event"] == "agent_failed" for entry in logs)


async def test_a_config_error_exits_2() -> None:
    async def misconfigured() -> None:
        raise ConfigError("--flag: bad value")

    agent = FakeAgent(worker=misconfigured)
    assert await asyncio.wait_for(run_agent(agent, grace_s=2, handle_signals=False), 5) == 2


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again() -> None:
    record: list[str] = []
    agent = FakeAgent(worker=_forever, stubborn=lambda: _swallows_cancellations(2, record))
    stop = asyncio.Event()
    task = await _run_until_ready(agent, stop)
    with capture_logs() as logs:
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
    assert record == ["swallowed", "swallowed", "stopped"]
    again = [entry["task"] for entry in logs if entry["event"] == "task_cancelled_again"]
    assert again == ["stubborn", "stubborn"]
    assert agent.events == ["open", "closed"]


async def test_a_swallowed_cancellation_after_a_failure_is_also_retried() -> None:
    record: list[str] = []

    agent = FakeAgent(failing=_fails, stubborn=lambda: _swallows_cancellations(1, record))
    assert await asyncio.wait_for(run_agent(agent, grace_s=2, handle_signals=False), 10) == 1
    assert record == ["swallowed", "stopped"]


async def test_the_closers_run_without_a_pending_cancellation_after_a_stop() -> None:
    """3.11's TaskGroup leaves its parent cancelling; a closer would then abort half-way."""
    seen: list[int] = []

    class _Agent(FakeAgent):
        async def open(self, resources: contextlib.AsyncExitStack) -> None:
            task = asyncio.current_task()
            assert task is not None
            resources.callback(lambda: seen.append(task.cancelling()))

    stop = asyncio.Event()
    agent = _Agent(idle=_forever)
    task = await _run_until_ready(agent, stop)
    stop.set()
    assert await task == 0
    assert seen == [0]


class StuckOpeningAgent(FakeAgent):
    """An agent whose open() waits on a blocking call that never returns (a write to a failing
    disk during recovery), after registering one closer."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.opening = asyncio.Event()

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        resources.callback(self.events.append, "closed")
        self.events.append("opening")
        self.opening.set()
        await asyncio.to_thread(self.release.wait)


async def test_a_stop_while_opening_ends_the_agent_without_waiting_for_open() -> None:
    agent = StuckOpeningAgent()
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(agent, grace_s=2, stop=stop, handle_signals=False))
    try:
        await asyncio.wait_for(agent.opening.wait(), 2)
        stop.set()
        assert await asyncio.wait_for(task, 2) == 0
        assert agent.events == ["opening", "closed"]
    finally:
        agent.release.set()
