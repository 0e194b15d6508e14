"""Inventory sanity in the health agent's inventory watcher, on a real nats-server: an empty
inventory and a generation going backwards are quarantined (logged, counted) and the last good
topology stays in force."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import structlog

from services.health.attribution import Topology
from services.health.inventory_watcher import inventory_watcher
from shared import metrics
from shared.bus import codec
from shared.bus.connection import Bus
from shared.pb.drasuite.v1 import inventory_pb2

pytestmark = pytest.mark.integration

DRIVER = "gpu.example.com"
NODE = "node-a"


def _inventory(generation: int, *parents: str) -> inventory_pb2.Inventory:
    devices = [inventory_pb2.Device(name="gpu-0", kind="gpu")]
    devices += [inventory_pb2.Device(name=f"gpu-0-mig-{p}", kind="mig", parent=p) for p in parents]
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="nvml", generation=generation, devices=devices
    )


def _rejected(reason: str) -> float:
    metrics.configure(service="test")
    line = f'dra_inventory_rejected_total{{reason="{reason}"}} '
    # Summed: tests run the allocation and health agents' counters of this name in one process.
    texts = metrics.render().decode().splitlines()
    return sum(float(t.removeprefix(line)) for t in texts if t.startswith(line))


async def test_the_watcher_keeps_the_last_good_topology(bus: Bus):
    seen: list[Topology] = []
    key = bus.names.inventory_key(DRIVER, NODE)

    async def put(inventory: inventory_pb2.Inventory) -> None:
        await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(inventory))

    async def until(check) -> None:
        async with asyncio.timeout(10):
            while True:
                if check():
                    return
                await asyncio.sleep(0.02)

    before = {r: _rejected(r) for r in ("empty", "generation_backwards")}
    watcher = asyncio.create_task(
        inventory_watcher(bus, driver=DRIVER, node=NODE, sink=seen.append)
    )
    try:
        await put(_inventory(4, "gpu-0"))
        await until(lambda: len(seen) == 1)
        good = seen[-1]
        with structlog.testing.capture_logs() as events:
            empty = _inventory(5)
            del empty.devices[:]
            await put(empty)
            await put(_inventory(3))
            await until(
                lambda: len([e for e in events if e["event"] == "inventory_quarantined"]) == 2
            )
            await put(_inventory(6))
            await until(lambda: len(seen) == 2)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert [e["reason"] for e in events if e["event"] == "inventory_quarantined"] == [
        "empty",
        "generation_backwards",
    ]
    assert seen[0] == good
    assert seen[0].devices == ("gpu-0", "gpu-0-mig-gpu-0")
    assert seen[1].devices == ("gpu-0",)
    after = {r: _rejected(r) for r in before}
    assert {r: after[r] - before[r] for r in before} == {
        "empty": 1.0,
        "generation_backwards": 1.0,
    }
