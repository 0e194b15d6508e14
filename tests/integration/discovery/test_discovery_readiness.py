"""The discovery agent's /readyz: not ready until its slices are published, and not ready while
the API server rejects one of them (the rejection's message is the reason); a device the
pre-publish check leaves out is a detail line of a ready answer."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from devcluster import flow
from devcluster.apiserver import APIServerEmulator
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings, OpsSettings
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim.profile import SimDevice
from shared.supervisor import run_agent
from shared.vendors.sim import discovery as sim

pytestmark = pytest.mark.integration

NODE = "ready-node"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _readyz(port: int) -> tuple[int, str]:
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/readyz") as response,
        ):
            return response.status, await response.text()
    except aiohttp.ClientConnectionError:
        return 0, ""


async def test_readiness_fails_with_the_api_servers_reason_while_a_slice_is_rejected(
    kube: APIServerEmulator, kube_settings: KubeSettings, nats_settings: NATSSettings
):
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    kube.faults.add(verb="create", resource="resourceslices", status=422)
    port = _free_port()
    config = DiscoveryConfig(
        nats=nats_settings,
        kube=kube_settings,
        node_name=NODE,
        sim_profile="gpu",
        ops=OpsSettings(ops_host="127.0.0.1", ops_port=port),
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(
        run_agent(DiscoveryAgent(config), grace_s=5, stop=stop, handle_signals=False)
    )
    try:

        async def rejected() -> str | None:
            status, text = await _readyz(port)
            return text if status == 503 and "rejected" in text else None

        reason = await flow.eventually(rejected, what="readiness to report the rejection")
        assert "422 Invalid: injected fault" in reason
        assert kube.objects("resourceslices") == []
    finally:
        stop.set()
        assert await runner == 0


async def test_a_device_left_out_of_the_slices_is_a_readiness_detail_and_marked_in_nats(
    kube: APIServerEmulator, kube_settings: KubeSettings, nats_settings: NATSSettings, bus: Bus
):
    """An 80-character chipName breaks the API's 64-byte limit: the device is not published,
    the agent stays ready (the rest of the pool is), and says so in /readyz and the inventory."""
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    backend = sim.SimBackend.from_profile("gpu")
    backend.add_device(SimDevice(name="gpu-long", kind="gpu", attributes={"chipName": "X" * 80}))
    port = _free_port()
    config = DiscoveryConfig(
        nats=nats_settings,
        kube=kube_settings,
        node_name=NODE,
        ops=OpsSettings(ops_host="127.0.0.1", ops_port=port),
    )
    stop = asyncio.Event()
    agent = DiscoveryAgent(config, backend=backend)
    runner = asyncio.create_task(run_agent(agent, grace_s=5, stop=stop, handle_signals=False))
    try:

        async def detailed() -> str | None:
            status, text = await _readyz(port)
            return text if status == 200 and "gpu-long" in text else None

        text = await flow.eventually(detailed, what="readiness to name the dropped device")
        assert text.startswith("ok\ndevices: 1 device(s) not published in ResourceSlices: ")
        assert "gpu-long (invalid: attribute 'chipName'" in text
        key = bus.names.inventory_key(config.driver_name, NODE)

        async def marked() -> inventory_pb2.Inventory | None:
            data = await bus.kv_get(bus.names.inventory_bucket, key)
            if data is None:
                return None
            inv = codec.decode(inventory_pb2.Inventory, data, subject=key)
            return inv if any(d.unpublished for d in inv.devices) else None

        inv = await flow.eventually(marked, what="the inventory to mark the dropped device")
        marks = {d.name: d.unpublished for d in inv.devices}
        assert marks["gpu-long"].startswith("invalid: attribute 'chipName'")
        assert [name for name, mark in marks.items() if mark] == ["gpu-long"]
    finally:
        stop.set()
        assert await runner == 0
