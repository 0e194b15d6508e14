"""The nvml backend and the nvml health monitor on a real NVIDIA GPU.

Skipped unless `DRA_SUITE_REAL_NVML=1` (never in CI: CI machines have no GPU). Run on a node
with the driver: `DRA_SUITE_REAL_NVML=1 .venv/bin/pytest -q tests/hardware`. What it holds
against the hardware: discovery reads every GPU as NVML reports it (UUID, memory, PCI bus ID,
names), its slices build under the newest rules, and the health monitor watches exactly the
devices discovery publishes, under the same names, reporting them healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re

import pytest

from services.discovery import apirules, slices
from shared import quantity
from shared.nvml import import_pynvml, text
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import nvml_api, nvml_events
from shared.vendors.nvidia.discovery import NvmlBackend
from shared.vendors.nvidia.discovery import NvmlOptions as NvmlBackendOptions
from shared.vendors.nvidia.monitor import NvmlMonitor
from shared.vendors.parts.discovery import Scan
from shared.vendors.parts.health import NvmlOptions
from shared.vendors.parts.observation import Observations
from shared.vendors.parts.sysfs import normalize_bus_id

pytestmark = [
    pytest.mark.hardware,
    pytest.mark.skipif(
        os.environ.get("DRA_SUITE_REAL_NVML") != "1", reason="DRA_SUITE_REAL_NVML=1 on a GPU node"
    ),
]

_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.ASCII)


def _attributes(device: inventory_pb2.Device) -> dict[str, object]:
    found: dict[str, object] = {}
    for name, value in device.attributes.items():
        kind = value.WhichOneof("value")
        found[name] = getattr(value, kind) if kind else None
    return found


async def test_discovery_reads_every_gpu_as_nvml_reports_it():
    pynvml = import_pynvml()

    backend = NvmlBackend.open(nvml_api.open_library(), options=NvmlBackendOptions(pci_bus_id=True))
    try:
        scan = await backend.scan()
        count = pynvml.nvmlDeviceGetCount()
        whole = [d for d in scan.devices if d.name.startswith("gpu-") and "-mig-" not in d.name]
        assert [d.name for d in whole] == [f"gpu-{i}" for i in range(count)]
        for index, device in enumerate(whole):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            published = _attributes(device)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            assert uuid in published.values(), (uuid, published)
            print(f"{device.name}: {published}, capacity {dict(device.capacity)}")
            bus_id = normalize_bus_id(text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
            assert _BUS_ID.match(bus_id)
            assert published["resource.kubernetes.io/pciBusID"] == bus_id
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            assert quantity.parse(device.capacity["memory"]) == total
        pool = slices.desired(_inventory(scan), rules=apirules.for_minor(apirules.NEWEST))
        assert pool
    finally:
        backend.close()


def _inventory(scan: Scan) -> inventory_pb2.Inventory:
    inventory = inventory_pb2.Inventory(
        driver="gpu.nvidia.com", node="real-node", pool="real-node", backend="nvml",
        generation=1,
    )  # fmt: skip
    inventory.devices.extend(scan.devices)
    inventory.shared_counters.extend(scan.shared_counters)
    return inventory


async def test_health_watches_the_devices_discovery_publishes_under_their_names():
    backend = NvmlBackend.open(nvml_api.open_library())
    try:
        published = {d.name for d in (await backend.scan()).devices if "-mig-" not in d.name}
    finally:
        backend.close()
    monitor = NvmlMonitor.open(
        nvml_events.open_library(), pool="real-node", options=NvmlOptions(wait_ms=200),
        refresh_s=0.5,
    )  # fmt: skip
    seen: asyncio.Queue[Observations] = asyncio.Queue()
    task = asyncio.create_task(monitor.run(seen.put_nowait))
    try:
        first = await asyncio.wait_for(seen.get(), 30)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    observed = {o.device: o for o in first.devices}
    assert set(observed) >= published, (sorted(observed), sorted(published))
    for name in published:
        assert observed[name].fault is None, (name, observed[name].fault)
