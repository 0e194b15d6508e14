"""`dra-allocation --kubelet-api device-plugin` as a process: a clear error and exit 2 while
the DRA front of the driver serves on the node, before it opens any connection; otherwise
it registers, is ready once registered, allocates, and on SIGTERM exits 0 without sockets."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
from asyncio.subprocess import Process
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from shared.bus.connection import Bus
from shared.config import NATSSettings
from tests.integration.allocation.deviceplugin_node import NPU, DevicePluginNode

pytestmark = pytest.mark.timeout(60)

DRIVER = "sim.dra-suite.io"


@pytest.fixture
async def base() -> AsyncIterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_the_device_plugin_front_exits_2_beside_a_live_dra_front(base: Path):
    registry = base / "registry"
    registry.mkdir()
    server = await asyncio.start_unix_server(
        lambda r, w: w.close(), path=str(registry / f"{DRIVER}-reg.sock")
    )
    try:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.allocation", "--node-name", "node-a"),
            *("--kubelet-api", "device-plugin", "--log-format", "console"),
            *("--nats-url", "nats://127.0.0.1:9"),  # never dialled: the check comes first
            *("--plugin-registry-dir", str(registry)),
            *("--plugin-data-dir", str(base / "data"), "--cdi-root", str(base / "cdi")),
            *("--device-plugin-dir", str(base / "dp")),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        server.close()
        await server.wait_closed()
    assert process.returncode == 2, output.decode()
    assert b"the DRA front of this driver serves on this node" in output
    assert not (base / "dp").exists() or not any((base / "dp").iterdir())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _status(port: int, path: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as got:
        return got.status


async def _agent_process(node: DevicePluginNode, *, port: int = 0) -> Process:
    """The allocation agent as a process, in device-plugin mode by its env twin."""
    config = node.config
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.allocation", "--node-name", node.node),
        *("--log-format", "console", "--ops-host", "127.0.0.1", "--ops-port", str(port)),
        *("--nats-url", config.nats.url, "--nats-namespace", config.nats.namespace),
        *("--plugin-registry-dir", str(config.plugin_registry_dir)),
        *("--plugin-data-dir", str(config.data_dir), "--cdi-root", str(config.cdi_root)),
        *("--device-plugin-dir", str(config.device_plugin_dir)),
        env={**os.environ, "KUBELET_API": "device-plugin"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def test_the_process_serves_the_device_plugin_front_and_stops_cleanly(
    nats_settings: NATSSettings, bus: Bus, base: Path
):
    node = DevicePluginNode(base, nats=nats_settings, bus=bus)
    await node.kubelet.start()
    port = free_port()
    config = node.config
    process = await _agent_process(node, port=port)
    try:
        async with asyncio.timeout(20):
            while True:  # serving, but not ready without an inventory
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    if await _status(port, "/healthz") == 200:
                        break
                await asyncio.sleep(0.1)
        assert await _status(port, "/readyz") == 503
        await node.publish_profile("ascend-310p-duo")
        await node.kubelet.wait_for_devices(NPU, lambda d: len(d) == 8, timeout_s=30)
        async with asyncio.timeout(10):
            while True:  # ready once the kubelet accepted the resource
                if await _status(port, "/readyz") == 200:
                    break
                await asyncio.sleep(0.1)
        assert await _status(port, "/healthz") == 200
        response = await node.kubelet.allocate(NPU, [["npu-4", "npu-5"]])
        assert response.container_responses[0].envs["ASCEND_VISIBLE_DEVICES"] == "4,5"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
        assert not any(config.device_plugin_dir.glob(f"{DRIVER}-*.sock"))
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await node.kubelet.stop()


async def test_after_a_kill_9_the_restarted_agent_registers_again_and_keeps_the_spec(
    nats_settings: NATSSettings, bus: Bus, base: Path
):
    node = DevicePluginNode(base, nats=nats_settings, bus=bus)
    await node.kubelet.start()
    await node.publish_profile("ascend-310p-duo")
    first = await _agent_process(node)
    second: Process | None = None
    try:
        await node.kubelet.wait_for_devices(NPU, lambda d: len(d) == 8, timeout_s=30)
        response = await node.kubelet.allocate(NPU, [["npu-6", "npu-7"]])
        spec = node.spec()
        first.kill()
        await first.wait()
        # The dead agent's socket file is still there; nothing answers on it.
        assert any(node.config.device_plugin_dir.glob(f"{DRIVER}-*.sock"))
        second = await _agent_process(node)
        await node.kubelet.wait_for_devices(
            NPU, lambda d: len(d) == 8 and node.kubelet.registrations == [NPU, NPU], timeout_s=30
        )
        assert node.spec() == spec
        node.resolve(response.container_responses[0].cdi_devices[0].name)
        again = await node.kubelet.allocate(NPU, [["npu-6"]])
        assert again.container_responses[0].envs["ASCEND_VISIBLE_DEVICES"] == "6"
    finally:
        for process in (first, second):
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
        await node.kubelet.stop()
