"""The monitor watchdog over the FakeMonitor: failures and silence make devices unmonitored."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from services.health.monitors.fake import FakeMonitor
from services.health.monitors.watchdog import Watchdog
from services.health.policy import UNMONITORED
from shared.backoff import Backoff
from shared.vendors.parts.observation import Fault, Observations

DEVICES = ("gpu-0", "gpu-1")


class Sink:
    def __init__(self) -> None:
        self.views: list[Observations] = []
        self.news = asyncio.Event()

    def __call__(self, view: Observations) -> None:
        self.views.append(view)
        self.news.set()

    async def next(self, timeout_s: float = 3.0) -> Observations:
        self.news.clear()
        await asyncio.wait_for(self.news.wait(), timeout_s)
        return self.views[-1]


@contextlib.asynccontextmanager
async def watched(monitor: FakeMonitor, *, deadline_s: float = 10.0) -> AsyncIterator[Sink]:
    sink = Sink()
    watchdog = Watchdog(
        monitor,
        name="fake",
        deadline_s=deadline_s,
        restart=Backoff(initial_s=0.05, max_s=0.05),
    )
    task = asyncio.create_task(watchdog.run(sink))
    try:
        yield sink
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def all_unmonitored(view: Observations) -> bool:
    return all(
        o.unknown and o.fault is not None and o.fault.cause == UNMONITORED for o in view.devices
    )


async def test_reports_pass_through_unchanged():
    monitor = FakeMonitor(pool="node-a", devices=DEVICES)
    async with watched(monitor) as sink:
        await asyncio.sleep(0.05)
        monitor.report({"gpu-1": Fault(cause="xid", code="79")})  # the sink is called at once
        view = sink.views[-1]
    assert view == monitor.view()
    assert not any(o.unknown for o in view.devices)


@pytest.mark.parametrize(
    "error",
    [RuntimeError("driver gone"), ValueError("bad output"), TimeoutError()],
    ids=["runtime error", "value error", "timeout"],
)
async def test_a_failing_monitor_marks_its_devices_unmonitored_then_recovers(error):
    monitor = FakeMonitor(pool="node-a", devices=DEVICES)
    async with watched(monitor) as sink:
        await asyncio.sleep(0.05)
        monitor.fail(error)
        view = await sink.next()
        assert [o.device for o in view.devices] == list(DEVICES)
        assert all_unmonitored(view)
        assert view.devices[0].fault is not None
        assert "monitor fake: the monitor failed" in view.devices[0].fault.message
        recovered = await sink.next()  # the restarted monitor reports on start
    assert not any(o.unknown for o in recovered.devices)
    assert monitor.runs == 2


async def test_a_silent_monitor_marks_its_devices_unmonitored_after_the_deadline():
    monitor = FakeMonitor(pool="node-a", devices=DEVICES)
    async with watched(monitor, deadline_s=0.2) as sink:
        await asyncio.sleep(0.05)
        view = await sink.next(timeout_s=2.0)
        assert all_unmonitored(view)
        assert view.devices[0].fault is not None
        assert "no report for" in view.devices[0].fault.message
        monitor.report()
        back = sink.views[-1]
    assert not any(o.unknown for o in back.devices)
    assert monitor.runs == 1


async def test_a_monitor_that_never_reported_marks_nothing():
    monitor = FakeMonitor(pool="node-a", devices=DEVICES, report_on_start=False)
    async with watched(monitor, deadline_s=0.1) as sink:
        await asyncio.sleep(0.05)
        monitor.fail(RuntimeError("no driver"))
        await asyncio.sleep(0.3)
    assert sink.views == []
