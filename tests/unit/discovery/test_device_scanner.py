"""The device scanner: first scan, change notification, failures keep the last inventory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from services.discovery import inventory
from services.discovery.scanner import DeviceScanner
from shared.sim.profile import SimDevice
from shared.vendors.sim import discovery as sim

IDENTITY = inventory.Identity(driver="sim.dra-suite.io", node="n1", pool="n1", backend="sim")


@pytest.fixture
def backend() -> sim.SimBackend:
    return sim.SimBackend([SimDevice(name="dev-0", kind="npu", attributes={"numaNode": 0})])


@pytest.fixture
async def scanner(backend: sim.SimBackend) -> AsyncIterator[DeviceScanner]:
    scanner = DeviceScanner(backend, identity=IDENTITY, interval_s=30, clock_ms=lambda: 5)
    task = asyncio.create_task(scanner.run())
    yield scanner
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_first_scan_gives_generation_one(scanner: DeviceScanner):
    first = await asyncio.wait_for(scanner.next(after=0), 2)
    assert first.generation == 1
    assert [d.name for d in first.devices] == ["dev-0"]
    assert first.scanned_unix_ms == 5


async def test_hot_plug_wakes_followers_with_the_next_generation(scanner, backend):
    await asyncio.wait_for(scanner.next(after=0), 2)
    backend.add_device(SimDevice(name="dev-1", kind="npu"))
    following = await asyncio.wait_for(scanner.next(after=1), 2)
    assert following.generation == 2
    assert [d.name for d in following.devices] == ["dev-0", "dev-1"]


async def test_a_change_signal_without_a_change_wakes_nobody(scanner, backend):
    await asyncio.wait_for(scanner.next(after=0), 2)
    backend.changed.set()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(scanner.next(after=1), 0.3)


async def test_failed_scan_keeps_the_last_inventory(backend):
    scanner = DeviceScanner(backend, identity=IDENTITY, interval_s=30)
    assert await scanner.scan_once()
    backend.set_available(False)
    assert not await scanner.scan_once()
    assert scanner.current is not None
    assert scanner.current.generation == 1
